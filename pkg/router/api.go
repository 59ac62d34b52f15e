package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/tokens"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// APIConfig configures the router's HTTP API. Zero values take the
// defaults. docs/api.md describes the API.
type APIConfig struct {
	// DeliverTokens may call POST /v1/deliver (MOBILE_DELIVER_TOKENS).
	DeliverTokens []string
	// AgentTokens may call the agent endpoints: /v1/sessions/…, /v1/events
	// and /v1/blobs/… (MOBILE_AGENT_TOKENS).
	AgentTokens []string
	// Tenants, when set, is the tenants file (MOBILE_TENANTS_FILE): its
	// agent and deliver keys call the API for their owners' devices. The
	// tokens above stay the legacy owner's.
	Tenants *tenant.Registry
	// Usage counts each owner's deliveries (the process's one recorder,
	// pkg/usage); GET /v1/usage reads the owners' counts from the store.
	// Nil counts nothing.
	Usage *usage.Recorder
	// HomeDevice is the target of a deliver without one (MOBILE_HOME_DEVICE).
	HomeDevice string

	// MaxBodyBytes bounds a request body (12 MiB: an 8 MiB file in base64
	// with its fields); a larger one gets 413 too_big.
	MaxBodyBytes int64
	// MaxBatchBytes bounds the body of POST /v1/deliver/batch (16 MiB:
	// 1,000 texts of 16 KiB, or a file and its texts); a larger one gets
	// 413 too_big.
	MaxBatchBytes int64
	// MaxBatchItems bounds the deliveries of one POST /v1/deliver/batch
	// (1,000); more get 413 too_big. The router holds a batch's deliveries
	// and results until the last is answered.
	MaxBatchItems int
	// KeepAlive is how long an event stream stays silent before it gets a
	// comment line (15 s), so proxies and clients see it is alive.
	KeepAlive time.Duration
	// WriteTimeout bounds each write to an event stream (10 s): a client
	// that stops reading is dropped.
	WriteTimeout time.Duration
	// MaxWaiting bounds the event reads that wait in the store at once (8).
	// Each holds a store connection (with Redis, one of the pool's) while it
	// waits; the reads beyond it poll once a second instead.
	MaxWaiting int
	// MaxStreams bounds the event reads (streams, long polls) one token
	// of the legacy owner has open at once on this router (8); past it GET
	// /v1/events gets 429 too_many_streams. A file owner's reads are
	// bounded by its event_reads quota instead, across every router.
	MaxStreams int
	// ReadyTimeout bounds the checks of /readyz (2 s).
	ReadyTimeout time.Duration

	// HeaderTimeout bounds reading a request's headers (5 s): on a new
	// connection from when it was accepted, on a kept-alive one from the
	// first bytes of its next request.
	HeaderTimeout time.Duration
	// FirstByteTimeout is how long a new connection may stay silent before
	// the first byte of its request (2 s); then it is closed.
	FirstByteTimeout time.Duration
	// BodyTimeout bounds reading a request's body, from the end of its
	// headers (30 s): a body that trickles in is cut off.
	BodyTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (16 KiB); larger ones get
	// 431.
	MaxHeaderBytes int
	// MaxConns bounds the connections served at once (1024). When they
	// are all open, a new one takes the place of a stranger, a connection
	// that has never presented a valid token, which is closed: one of the
	// client address holding the most strangers, the one that has waited
	// longest for its request in any state (silent since it connected,
	// sending its headers, or idle between requests), else the one whose
	// request has run longest. A connection that presented a valid token
	// is never closed for a new one; with only such open, the new one
	// waits until one closes.
	MaxConns int
	// StrangerGrace is how long a stranger is safe from that eviction
	// after it connected (250 ms): a client's own new connections in a
	// burst (Go's transport dials more than it keeps) are not closed
	// before the router reads the request already waiting on them. When
	// the address holding the most strangers has only such new ones, a
	// new connection waits for its first to pass the grace (or for any
	// connection to close): never longer than the grace.
	StrangerGrace time.Duration
	// AnonIdleTimeout is how long a keep-alive connection that has never
	// presented a valid token stays open between requests (5 s; one that
	// did keeps the server's 2 minutes): health checks and strangers
	// cannot hold the connection limit.
	AnonIdleTimeout time.Duration
}

func (c *APIConfig) setDefaults() {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 12 << 20
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = 16 << 20
	}
	if c.MaxBatchItems <= 0 {
		c.MaxBatchItems = 1000
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 15 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.MaxWaiting <= 0 {
		c.MaxWaiting = 8
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 8
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 2 * time.Second
	}
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = 5 * time.Second
	}
	if c.FirstByteTimeout <= 0 {
		c.FirstByteTimeout = 2 * time.Second
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 16 << 10
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.AnonIdleTimeout <= 0 {
		c.AnonIdleTimeout = 5 * time.Second
	}
	if c.StrangerGrace <= 0 {
		c.StrangerGrace = 250 * time.Millisecond
	}
}

// API is the router's HTTP API: deliver for cron and `hermes send`, and the
// agent link (the event log, the agent's output, uploaded files) for an
// agent outside the gateway. Create it with NewAPI; it is an http.Handler.
type API struct {
	r         *Router
	cfg       APIConfig
	deliverer *dispatch.Deliverer // POST /v1/deliver's, with cfg.HomeDevice
	groups    *dispatch.Groups    // its requests' groups by edge
	log       *slog.Logger
	mux       *http.ServeMux

	// SHA-256 digests of the tokens: compared in constant time, every one
	// of them, whatever the token presented.
	deliverTokens, agentTokens tokens.Set

	// endpoints are the routes and their methods, as handle registers
	// them; httpm counts their requests.
	endpoints map[string][]string
	handlers  map[string]map[string]handlerFunc // by path and method
	httpm     *telemetry.HTTPServer
	health    *admin.Server // answers /healthz and /readyz

	waiting chan struct{} // a slot per event read waiting in the store
	readers atomic.Int64  // event reads in progress (long polls, streams)

	streamsMu sync.Mutex
	streams   map[tokens.Digest]int // event requests open, by token digest
	// leaseIDs begins the ids of this API's file owners' event reads in
	// the store (random: unique across routers); leaseSeq ends them.
	leaseIDs string
	leaseSeq atomic.Uint64

	// ctx ends with Close or with the router: the event streams end.
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

// NewAPI returns the HTTP API of r. The API uses r's store, bus and
// outputs, so it works while r runs; Close (or the router's) ends its event
// streams.
func NewAPI(r *Router, cfg APIConfig) *API {
	cfg.setDefaults()
	a := &API{
		r: r, cfg: cfg, log: r.log, // the router's: the API is a part of it
		mux:           http.NewServeMux(),
		deliverTokens: tokens.NewSet(cfg.DeliverTokens),
		agentTokens:   tokens.NewSet(cfg.AgentTokens),
		waiting:       make(chan struct{}, cfg.MaxWaiting),
		streams:       make(map[tokens.Digest]int),
		leaseIDs:      ids.New("read") + ":",
		endpoints:     make(map[string][]string),
	}
	// The API's deliveries go by groups (dispatch.Groups): callers that
	// overlap share their edge's requests. The agent's outputs do not: its
	// typing states, published on the edge's output subject, must come
	// before the message that follows them.
	a.groups = dispatch.NewGroups(r.cfg.Telemetry.Meter())
	grouped := &dispatch.Dispatcher{Owners: r.store, Bus: r.bus, Cache: r.sender.Cache, Groups: a.groups}
	a.deliverer = &dispatch.Deliverer{Dispatcher: grouped, Blobs: r.store, BlobTTL: r.cfg.BlobTTL, HomeDevice: cfg.HomeDevice, Outbox: r.outbox,
		Tracer: r.tel.deliverTracer()}
	a.ctx, a.cancel = context.WithCancel(r.ctx)
	a.health = a.newHealth()
	a.routes()
	a.httpm = r.tel.process.HTTPServer(a.endpoints)
	return a
}

// Close ends the event streams, so that http.Server.Shutdown need not wait
// for them (register it with http.Server.RegisterOnShutdown). Other
// requests finish. It is idempotent.
func (a *API) Close() { a.closeOnce.Do(a.cancel) }

// Output returns the agent.Output of device: what is sent through it
// reaches the device, or its outbox while it is offline, as the agent's own
// output does. The API's agent endpoints speak through it.
func (r *Router) Output(device string) agent.Output { return &output{r: r, device: device} }

// access says who may call an endpoint.
type access int

const (
	public access = iota
	deliverOnly
	agentOnly
)

func (a *API) routes() {
	a.handle("POST", "/v1/deliver", deliverOnly, a.deliver)
	a.handle("POST", "/v1/deliver/batch", deliverOnly, a.deliverBatch)
	a.handle("POST", "/v1/sessions/{session}/messages", agentOnly, a.postMessage)
	a.handle("POST", "/v1/sessions/{session}/media", agentOnly, a.postMedia)
	a.handle("POST", "/v1/sessions/{session}/prompts", agentOnly, a.postPrompt)
	a.handle("DELETE", "/v1/sessions/{session}/prompts/{id}", agentOnly, a.deletePrompt)
	a.handle("POST", "/v1/sessions/{session}/typing", agentOnly, a.postTyping)
	a.handle("POST", "/v1/sessions/{session}/avatar", agentOnly, a.postAvatar)
	a.handle("GET", "/v1/events", agentOnly, a.events)
	a.handle("GET", "/v1/blobs/{key}", agentOnly, a.blob)
	a.handle("PUT", "/v1/devices/{device}/push", agentOnly, a.putPush)
	a.handle("DELETE", "/v1/devices/{device}/push", agentOnly, a.deletePush)
	a.handle("GET", "/v1/usage", agentOnly, a.usage)
	a.handle("GET", "/healthz", public, probe(a.health.Healthz))
	a.handle("GET", "/readyz", public, probe(a.health.Readyz))
	a.mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		a.fail(w, req, apiErr(http.StatusNotFound, codeNotFound, "no such endpoint; see docs/api.md"))
	})
}

// handlerFunc is an endpoint: an error it returns is the answer (an
// *apiError, or anything else as internal_error).
type handlerFunc func(w http.ResponseWriter, req *http.Request) error

// handle registers h for method (GET also answers HEAD) and path, behind
// the access check. Paths are registered without a method so that a wrong
// method gets a JSON 405 rather than the mux's text one; a path may be
// registered again for another method.
func (a *API) handle(method, path string, acc access, h handlerFunc) {
	first := len(a.endpoints[path]) == 0
	a.endpoints[path] = append(a.endpoints[path], method)
	if method == "GET" {
		a.endpoints[path] = append(a.endpoints[path], "HEAD")
	}
	if a.handlers == nil {
		a.handlers = make(map[string]map[string]handlerFunc)
	}
	if a.handlers[path] == nil {
		a.handlers[path] = make(map[string]handlerFunc)
	}
	a.handlers[path][method] = func(w http.ResponseWriter, req *http.Request) error {
		req, err := a.authorize(req, acc)
		if err != nil {
			return err
		}
		return h(w, req)
	}
	if !first {
		return
	}
	hs := a.handlers[path]
	a.mux.HandleFunc(path, func(w http.ResponseWriter, req *http.Request) {
		m := req.Method
		if m == "HEAD" && hs["HEAD"] == nil {
			m = "GET"
		}
		h := hs[m]
		if h == nil {
			w.Header().Set("Allow", strings.Join(slices.DeleteFunc(slices.Clone(a.endpoints[path]), func(s string) bool { return s == "HEAD" }), ", "))
			a.fail(w, req, apiErr(http.StatusMethodNotAllowed, codeMethodNotAllowed, req.Method+" is not allowed here; use "+w.Header().Get("Allow")))
			return
		}
		if err := h(w, req); err != nil {
			a.fail(w, req, err)
		}
	})
}

// ServeHTTP serves the API.
func (a *API) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	if lc, ok := req.Context().Value(connKey{}).(*limitConn); ok {
		defer lc.served()
	}
	if req.ContentLength != 0 {
		// A body is read (or discarded) within BodyTimeout; decode lifts
		// the deadline once it has the body. A request without one keeps
		// no deadline: an event stream lasts.
		_ = http.NewResponseController(w).SetReadDeadline(start.Add(a.cfg.BodyTimeout))
	}
	req, span := a.r.tel.startRequest(req)
	sw := &statusWriter{ResponseWriter: w}
	a.mux.ServeHTTP(sw, req)
	took := time.Since(start)
	// The mux set req.Pattern to the route it chose: the catch-all "/" of
	// unknown paths is none of the endpoints, so it counts as other.
	a.httpm.Request(req.Pattern, req.Method, sw.status, took)
	route := req.Pattern
	if _, ok := a.endpoints[route]; !ok {
		route = telemetry.RouteOther
	}
	status := sw.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http's answer
	}
	// The route, not the path (it names sessions), and never the headers or
	// the query: the token is in one, cursors in the other. Made in the
	// request's span, the line carries its trace_id and span_id. A request
	// answered below 400 is a debug line: at cron's pace (5,000 deliveries
	// a second) an info line each was 6% of the router's CPU, and
	// hermes_http_requests_total counts them all.
	level := slog.LevelInfo
	if status < http.StatusBadRequest {
		level = slog.LevelDebug
	}
	a.log.LogAttrs(req.Context(), level, "api request", slog.String("method", req.Method),
		slog.String("route", route), slog.Int("status", status), slog.String("client", req.RemoteAddr),
		slog.Float64("duration", took.Seconds()))
	if span != nil {
		telemetry.EndServerSpan(span, req.Method, route, status)
	}
}

// callerKey is the request context's key of its *caller.
type callerKey struct{}

// caller is who authorize let in: the owner its credential belongs to,
// and the owner key it is (nil for a token of the environment, the
// legacy owner's).
type caller struct {
	owner string
	key   *tenant.Key
}

// ownerOf is the owner of the credential req was let in with: the legacy
// owner for the environment's tokens (whose requests carry no caller).
// The devices a request names are this owner's (deviceKey).
func ownerOf(req *http.Request) string {
	if c, ok := req.Context().Value(callerKey{}).(*caller); ok {
		return c.owner
	}
	return tenant.Legacy
}

// keyOf is the owner key req was let in with; nil for a token of the
// environment.
func keyOf(req *http.Request) *tenant.Key {
	if c, ok := req.Context().Value(callerKey{}).(*caller); ok {
		return c.key
	}
	return nil
}

// authorize checks the bearer token for acc, and returns req with its
// caller: the owner its devices are scoped to.
func (a *API) authorize(req *http.Request, acc access) (*http.Request, error) {
	if acc == public {
		return req, nil
	}
	token, ok := bearer(req.Header.Get("Authorization"))
	if !ok {
		return req, apiErr(http.StatusUnauthorized, protocol.CodeAuthFailed, "send Authorization: Bearer <token>")
	}
	var (
		who                         *caller // nil: a token of the environment, the legacy owner's
		isDeliver, isAgent, isOther bool
	)
	if a.cfg.Tenants != nil && tenant.IsCredential(token) {
		k, ok := a.cfg.Tenants.Snapshot().Verify(token)
		if !ok {
			return req, apiErr(http.StatusUnauthorized, protocol.CodeAuthFailed, "invalid token")
		}
		who = &caller{owner: k.Owner, key: k}
		isDeliver, isAgent = k.Kind == tenant.KindDeliver, k.Kind == tenant.KindAgent
		isOther = !isDeliver && !isAgent // a phone's key
	} else {
		d := tokens.Sum(token)
		isDeliver, isAgent = a.deliverTokens.Has(d), a.agentTokens.Has(d)
	}
	switch {
	case acc == deliverOnly && isDeliver, acc == agentOnly && isAgent:
		if c, ok := req.Context().Value(connKey{}).(*limitConn); ok {
			c.trust.CompareAndSwap(stranger, authed) // unless evict closed it first
		}
		if who == nil {
			// ownerOf's default: no copy of the request on the hot path
			// of cron's and the agent's calls.
			return req, nil
		}
		return req.WithContext(context.WithValue(req.Context(), callerKey{}, who)), nil
	case isDeliver || isAgent || isOther:
		return req, apiErr(http.StatusForbidden, protocol.CodeForbidden, "this token may not call this endpoint")
	}
	return req, apiErr(http.StatusUnauthorized, protocol.CodeAuthFailed, "invalid token")
}

// bearer takes the token out of an Authorization header.
func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// Error codes of the API that the protocol has no code for.
const (
	codeNotFound         protocol.Code = "not_found"
	codeMethodNotAllowed protocol.Code = "method_not_allowed"
)

// apiError is an answer other than 200: an HTTP status and a JSON body
// {"error": code, "message": message}.
type apiError struct {
	status  int
	code    protocol.Code
	message string
}

func (e *apiError) Error() string { return string(e.code) + ": " + e.message }

func apiErr(status int, code protocol.Code, message string) *apiError {
	return &apiError{status, code, message}
}

// badFrame, tooBig and unsupported are the protocol's validation answers.
func badFrame(format string, args ...any) *apiError {
	return apiErr(http.StatusBadRequest, protocol.CodeBadFrame, fmt.Sprintf(format, args...))
}

func tooBig(format string, args ...any) *apiError {
	return apiErr(http.StatusRequestEntityTooLarge, protocol.CodeTooBig, fmt.Sprintf(format, args...))
}

func unsupported(format string, args ...any) *apiError {
	return apiErr(http.StatusBadRequest, protocol.CodeUnsupportedFrame, fmt.Sprintf(format, args...))
}

// fail answers with err. An error that is not an *apiError is the
// gateway's: 503 when the store or the bus cannot be reached (retry), 500
// otherwise; its text is logged, not sent.
func (a *API) fail(w http.ResponseWriter, req *http.Request, err error) {
	var e *apiError
	if !errors.As(err, &e) && req.Context().Err() != nil {
		a.log.DebugContext(req.Context(), "request ended by the client", "method", req.Method, "path", req.URL.Path, "err", err)
		return
	}
	e = a.answerFor(req, err)
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if e.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="hermes"`)
		if req.ContentLength != 0 {
			// Nothing more is read from a client that is not let in: its
			// body is not discarded, the connection closes after the answer.
			w.Header().Set("Connection", "close")
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
	}
	admin.WriteJSON(w, e.status, errorBody{Error: string(e.code), Message: e.message})
}

// answerFor is the answer to err: err itself when it is an *apiError, or
// else the gateway's failure (logged, its text not sent): 503 when the
// store or the bus cannot be reached (retry), 500 otherwise.
func (a *API) answerFor(req *http.Request, err error) *apiError {
	var e *apiError
	if !errors.As(err, &e) {
		switch {
		case errors.Is(err, store.ErrBadCursor):
			e = badFrame("the cursor is not one the event log hands out")
		case errors.Is(err, store.ErrUnavailable), errors.Is(err, bus.ErrUnavailable),
			errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled): // the API closing
			a.log.WarnContext(req.Context(), "request failed", "method", req.Method, "path", req.URL.Path, "err", err)
			e = apiErr(http.StatusServiceUnavailable, protocol.CodeInternalError, "the gateway's store or bus cannot be reached right now; retry")
		default:
			a.log.ErrorContext(req.Context(), "request failed", "method", req.Method, "path", req.URL.Path, "err", err)
			e = apiErr(http.StatusInternalServerError, protocol.CodeInternalError, "the gateway failed; retry later")
		}
	}
	return e
}

type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// okBody answers a request that did what it asked.
type okBody struct {
	OK bool   `json:"ok"`
	ID string `json:"id,omitempty"`
	// Queued: a deliver with a ttl is kept in the device's outbox (202).
	Queued bool `json:"queued,omitempty"`
}

// decodeOpts read request bodies as the edge reads frames: members matched
// by exact name, unknown ones ignored, the last of a repeated one kept,
// invalid UTF-8 refused.
var decodeOpts = jsonv2.JoinOptions(
	jsontext.AllowDuplicateNames(true),
	jsontext.AllowInvalidUTF8(false),
)

// decode reads the JSON body of req into v, within MaxBodyBytes. An empty
// body is {}.
func (a *API) decode(w http.ResponseWriter, req *http.Request, v any) error {
	return a.decodeWithin(w, req, v, a.cfg.MaxBodyBytes)
}

// decodeWithin is decode with a bound of max bytes.
func (a *API) decodeWithin(w http.ResponseWriter, req *http.Request, v any, max int64) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, max))
	if err == nil {
		// The body is in; the handler may take longer than BodyTimeout.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooBig("the request body is larger than %d bytes", mbe.Limit)
	}
	if err != nil {
		return badFrame("reading the request body: %v", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	return decodeJSON(data, v, "the body")
}

// decodeJSON decodes data, the body or one delivery of a batch (what),
// into v. An error says what is wrong in the API's terms, the member and
// the JSON it takes ("ttl must be a number, not a string"), never in Go's.
func decodeJSON(data []byte, v any, what string) error {
	err := jsonv2.Unmarshal(data, v, decodeOpts)
	var syn *jsontext.SyntacticError
	var sem *jsonv2.SemanticError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &syn):
		in := ""
		if name := memberName(syn.JSONPointer); name != "" {
			in = " in " + name
		}
		return badFrame("%s is not valid JSON: %v%s (at byte %d)", what, syn.Err, in, syn.ByteOffset)
	case errors.As(err, &sem) && sem.GoType != nil:
		name := memberName(sem.JSONPointer)
		if name == "" {
			name = what
		}
		want := jsonType(sem.GoType)
		if want == "a base64 string" && sem.JSONKind == '"' {
			return badFrame("%s must be a base64 string (standard alphabet, padded)", name)
		}
		return badFrame("%s must be %s, not %s", name, want, jsonGot(sem, want))
	}
	return badFrame("%s is not the JSON expected", what)
}

// memberName is the member at p as a client writes it: "media.data",
// "choices[0]"; "" for the whole value.
func memberName(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

// jsonType is the JSON that a value of Go type t is decoded from.
func jsonType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "other JSON"
}

// jsonGot is the JSON that sem could not decode where want was needed:
// its kind, or the number that does not fit a number member.
func jsonGot(sem *jsonv2.SemanticError, want string) string {
	switch sem.JSONKind {
	case '"':
		return "a string"
	case '0':
		n := string(sem.JSONValue)
		if want != "a number" && want != "a whole number" || n == "" || len(n) > 32 {
			return "a number"
		}
		// 1.5 is no whole number; 1e30 and 1e999 are out of range.
		if f, err := strconv.ParseFloat(n, 64); err != nil || f == math.Trunc(f) {
			return n + " (out of range)"
		}
		return n
	case 't', 'f', 'n':
		return sem.JSONKind.String()
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "that value"
}

// statusWriter records the status for the request log. It passes Flush and
// the deadlines through (Unwrap), which the event stream needs.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Server returns the http.Server of the API, with its header deadline and
// size bound, logging its errors to errLog. Serve it on Listener(ln).
func (a *API) Server(errLog *log.Logger) *http.Server {
	srv := &http.Server{
		Handler:           a,
		ReadHeaderTimeout: a.cfg.HeaderTimeout,
		MaxHeaderBytes:    a.cfg.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          errLog,
		// No ReadTimeout or WriteTimeout: event streams last. Bodies have
		// BodyTimeout; each write of a stream has WriteTimeout.
		// The connection of a request is where authorize marks a valid
		// token; ConnState tells which ones wait for a request.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if lc, ok := c.(*limitConn); ok {
				return context.WithValue(ctx, connKey{}, lc)
			}
			return ctx
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if lc, ok := c.(*limitConn); ok {
				lc.setState(st)
			}
		},
	}
	srv.RegisterOnShutdown(a.Close)
	return srv
}

// connKey is the request context's key of its *limitConn.
type connKey struct{}

// Listener wraps ln so that at most MaxConns of its connections are open
// at once. When all are, Accept takes a new connection and closes a
// stranger (one that never presented a valid token) to make room for it
// (evict), one accepted at least StrangerGrace ago; with none such, it
// waits for one to close. A stranger also has FirstByteTimeout
// for the first byte of its first request and AnonIdleTimeout between
// requests.
func (a *API) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, a.cfg.MaxConns), done: make(chan struct{}),
		firstByte: a.cfg.FirstByteTimeout, anonIdle: a.cfg.AnonIdleTimeout, grace: a.cfg.StrangerGrace,
		conns: make(map[*limitConn]struct{})}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	firstByte time.Duration
	anonIdle  time.Duration
	grace     time.Duration
	order     atomic.Int64 // counts the connections' changes of state

	mu    sync.Mutex
	conns map[*limitConn]struct{} // open ones
}

// Accept takes the next connection first and a slot for it second, so
// that a stranger is closed only for a connection that came, not for one
// that might.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := l.take(); err != nil {
		c.Close()
		return nil, err
	}
	now := time.Now()
	lc := &limitConn{Conn: c, l: l, src: clientHost(c.RemoteAddr())}
	lc.since.Store(l.order.Add(1))
	lc.accepted.Store(now.UnixNano())
	lc.firstByte.Store(now.Add(l.firstByte).UnixNano())
	_ = c.SetReadDeadline(now.Add(l.firstByte))
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// take waits for a slot, making one by evict when a stranger may go, and
// else for one to close or, when the strangers are all new, for the first
// to pass its grace.
func (l *limitListener) take() error {
	for {
		select {
		case l.sem <- struct{}{}:
			return nil
		default:
		}
		var graced <-chan time.Time // nil: no stranger to wait for
		if wait := l.evict(time.Now()); wait > 0 {
			graced = time.After(wait)
		}
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-graced:
		case <-l.done:
			return net.ErrClosed
		}
	}
}

// evict closes a stranger, if there is one, and its slot frees at once:
// of the client address holding the most strangers (a flood from one
// address does not push out the others), the one that has waited longest
// for a request, else the one whose request has run longest, among those
// accepted at least the grace ago. When that address has none such yet,
// it closes nothing and returns how long until its first has (0: closed
// one, or there is none).
func (l *limitListener) evict(now time.Time) time.Duration {
	for {
		type source struct {
			strangers int
			first     *limitConn // of those past their grace
			firstDue  int64      // of the others, the first to pass it: accepted then (UnixNano)
		}
		sources := make(map[string]*source)
		var pick *source
		l.mu.Lock()
		for c := range l.conns {
			if c.trust.Load() != stranger {
				continue
			}
			s := sources[c.src]
			if s == nil {
				s = &source{}
				sources[c.src] = s
			}
			s.strangers++
			if at := c.accepted.Load(); now.Sub(time.Unix(0, at)) < l.grace {
				if s.firstDue == 0 || at < s.firstDue {
					s.firstDue = at
				}
			} else if s.first == nil || c.before(s.first) {
				s.first = c
			}
		}
		l.mu.Unlock()
		for _, s := range sources {
			if pick == nil || s.strangers > pick.strangers ||
				s.strangers == pick.strangers && s.first != nil && (pick.first == nil || s.first.before(pick.first)) {
				pick = s
			}
		}
		if pick == nil {
			return 0
		}
		if pick.first == nil { // the source's strangers are all new: the first passes its grace then
			return l.grace - now.Sub(time.Unix(0, pick.firstDue))
		}
		// Unless a valid token marked it in the meantime: then pick again.
		if pick.first.trust.CompareAndSwap(stranger, evicted) {
			pick.first.Close()
			return 0
		}
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// clientHost is the address of a connection's client without its port.
func clientHost(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// The trust of a connection: a stranger until a request on it presents a
// valid token (authed) or evict closes it (evicted), never both.
const (
	stranger int32 = iota
	authed
	evicted
)

type limitConn struct {
	net.Conn
	l     *limitListener
	src   string // the client's address
	once  sync.Once
	trust atomic.Int32
	// since orders when it was accepted, went idle or began a request
	// (the listener's order); accepted is when it was accepted
	// (UnixNano); serving says it is serving a request (http.StateActive).
	since    atomic.Int64
	accepted atomic.Int64
	serving  atomic.Bool
	// firstByte is the deadline of its first byte (UnixNano), 0 once it
	// came; header is the read deadline the server set meanwhile, which
	// holds from the first byte on.
	firstByte atomic.Int64
	header    atomic.Int64
}

// before says whether evict takes c before d: a connection waiting for a
// request before one serving one, then the one in its state longer.
func (c *limitConn) before(d *limitConn) bool {
	if cs, ds := c.serving.Load(), d.serving.Load(); cs != ds {
		return ds
	}
	return c.since.Load() < d.since.Load()
}

func (c *limitConn) setState(st http.ConnState) {
	switch st {
	case http.StateActive:
		c.serving.Store(true)
		c.since.Store(c.l.order.Add(1))
	case http.StateIdle:
		c.served()
	}
}

// served marks c waiting for its next request, once per request: when its
// handler returns (ServeHTTP), before the response is flushed, and again,
// with no effect, when net/http calls it idle, which may be after the
// client has read the response and made other requests.
func (c *limitConn) served() {
	if c.serving.Swap(false) {
		c.since.Store(c.l.order.Add(1))
	}
}

// SetReadDeadline shortens the server's waits for a stranger's request:
// to FirstByteTimeout from its acceptance until its first byte, and to
// AnonIdleTimeout from now for the keep-alive wait (set just after the
// connection went idle) and the headers of a later request.
func (c *limitConn) SetReadDeadline(t time.Time) error {
	if !t.IsZero() && c.trust.Load() != authed {
		var limit time.Time
		if fb := c.firstByte.Load(); fb != 0 {
			c.header.Store(t.UnixNano())
			limit = time.Unix(0, fb)
		} else if !c.serving.Load() {
			limit = time.Now().Add(c.l.anonIdle)
		}
		if !limit.IsZero() && t.After(limit) {
			t = limit
		}
	}
	return c.Conn.SetReadDeadline(t)
}

// Read lifts the first byte's deadline once it came: the server's header
// deadline holds instead.
func (c *limitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.firstByte.Load() != 0 && c.firstByte.Swap(0) != 0 {
		var t time.Time
		if h := c.header.Load(); h != 0 {
			t = time.Unix(0, h)
		}
		_ = c.Conn.SetReadDeadline(t)
	}
	return n, err
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}
