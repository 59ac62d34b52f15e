package router_test

// The tests of the router's HTTP API run over real sockets: a gateway node
// that phones connect to (pkg/client), and a router with the link agent
// and its API. Every test runs twice:
//
//   - single: one node with its own router, embedded NATS and the memory
//     store, serving the API itself (gateway.Config.APIListen).
//   - cluster: the node without a router, and a router of its own, sharing
//     a Redis (REDIS_URL or 127.0.0.1:6379) and a NATS (NATS_URL or
//     127.0.0.1:4222) with a Redis key prefix and a NATS subject prefix of
//     the test's own, so tests running at the same time, here or in other
//     packages, do not take each other's events. The API is served by an
//     httptest server. Without NATS or Redis the variant is skipped, or
//     fails when CI is set.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

const (
	phoneToken   = "phone-token"
	deliverToken = "deliver-token"
	agentToken   = "agent-token"
)

// env is a node for phones and a router with its API.
type env struct {
	node   *gateway.Gateway
	router *router.Router
	store  store.Store // the router's
	api    *router.API
	url    string // of the API

	redisURL, redisPrefix string             // the cluster variant's Redis and key prefix
	natsPrefix            string             // and its NATS subject prefix
	nodeConfig            gateway.Config     // and its first node's configuration
	nodes                 []*gateway.Gateway // the cluster variant's: node and the others
}

// apiConfig is the API configuration of the tests; mutate adjusts it.
func apiConfig(mutate func(*router.APIConfig)) router.APIConfig {
	cfg := router.APIConfig{
		DeliverTokens: []string{"other-deliver-token", deliverToken},
		AgentTokens:   []string{agentToken},
		KeepAlive:     300 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	return cfg
}

// eachEnv runs test on the single and the cluster variant, in parallel.
func eachEnv(t *testing.T, mutate func(*router.APIConfig), test func(t *testing.T, e *env)) {
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		test(t, startSingle(t, apiConfig(mutate)))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		test(t, startCluster(t, apiConfig(mutate)))
	})
}

func nodeConfig() gateway.Config {
	return gateway.Config{
		Listen: "127.0.0.1:0",
		// AckWait: how long a deliver with "wait":"ack" waits for a phone
		// that does not ack (TestDeliverWaitAck).
		Edge: edge.Config{Auth: edge.AuthConfig{Token: phoneToken}, AckWait: time.Second},
	}
}

// startSingle starts one node with a router running the link agent on the
// node's own store, and the router's API, as gateway.Config asks.
func startSingle(t *testing.T, cfg router.APIConfig) *env {
	t.Helper()
	nc := nodeConfig()
	nc.Router, nc.NewAgent, nc.APIListen, nc.API = true, agent.Named("link", agent.OpenAIConfig{}, 0), "127.0.0.1:0", cfg
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "node"))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("closing the node: %v", err)
		}
	})
	if g.API == nil || !strings.HasPrefix(g.APIURL(), "http://127.0.0.1:") {
		t.Fatalf("the node serves no API (%q)", g.APIURL())
	}
	return &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
}

// startCluster starts a node without a router and a router of its own on a
// shared Redis and a NATS server of the test's.
func startCluster(t *testing.T, cfg router.APIConfig) *env {
	t.Helper()
	return startClusterOf(t, cfg, nil)
}

// startClusterOf is startCluster whose node reads the owners of reg (nil:
// none).
func startClusterOf(t *testing.T, cfg router.APIConfig, reg *tenant.Registry) *env {
	t.Helper()
	return startClusterWith(t, cfg, cluster{tenants: reg, edges: 1})
}

// cluster is what startClusterWith starts: edges nodes (without routers)
// reading the owners of tenants (nil: none), and a router whose metrics go
// to telemetry (nil: none).
type cluster struct {
	tenants   *tenant.Registry
	edges     int
	telemetry *telemetry.Telemetry
	ackWait   time.Duration // the edges' edge.Config.AckWait; zero: nodeConfig's
}

// startClusterWith starts the nodes and the router of c on a shared Redis
// and a NATS server of the test's; e.node is the first node, e.nodes all.
func startClusterWith(t *testing.T, cfg router.APIConfig, c cluster) *env {
	t.Helper()
	redisURL := testsvc.RedisURL(t)
	natsURL := testsvc.NATSURL(t)
	prefix := "hermes-routertest:" + testsvc.RandomHex(6) + ":"
	cleanRedis(t, redisURL, prefix)
	log := testLogger(t, "router")

	natsPrefix := "rt" + testsvc.RandomHex(3) + "." // the router and the edges must agree
	var nodes []*gateway.Gateway
	var first gateway.Config
	for i := range c.edges {
		nc := nodeConfig()
		nc.NATSURL, nc.NATSPrefix, nc.RedisURL, nc.RedisPrefix, nc.Tenants = natsURL, natsPrefix, redisURL, prefix, c.tenants
		if c.ackWait > 0 {
			nc.Edge.AckWait = c.ackWait
		}
		if i == 0 {
			first = nc
		}
		g, err := gateway.Start(t.Context(), nc, testLogger(t, fmt.Sprintf("node%d", i)))
		if err != nil {
			t.Fatalf("start node: %v", err)
		}
		t.Cleanup(func() { g.Close() })
		nodes = append(nodes, g)
	}

	st, err := redisstore.New(t.Context(), redisstore.Options{URL: redisURL, Prefix: prefix})
	if err != nil {
		t.Fatalf("redisstore: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Connect(natsURL, natsbus.Options{Logger: log, Name: "router-test", SubjectPrefix: natsPrefix})
	if err != nil {
		t.Fatalf("natsbus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	// The router counts its owners' usage, as a node does, and its outbox
	// bounds the owners' outboxes by their quota.
	u, err := usage.New(usage.Options{Tenants: c.tenants, Store: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	go u.Run(ctxFor(t, time.Hour))
	if cfg.Usage == nil {
		cfg.Usage = u
	}
	ob := dispatch.NewOutbox(dispatch.OutboxConfig{Tenants: c.tenants, Usage: u}, st, b, log)
	t.Cleanup(ob.Close)
	r := router.New(router.Config{Outbox: ob, Telemetry: c.telemetry}, st, b, agent.NewLink(st, 1000), log)
	if err := r.Start(); err != nil {
		t.Fatalf("router: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return serve(t, &env{node: nodes[0], nodes: nodes, router: r, store: st, redisURL: redisURL, redisPrefix: prefix,
		natsPrefix: natsPrefix, nodeConfig: first}, cfg)
}

// serve serves the API of e.router on a loopback port until t ends.
func serve(t *testing.T, e *env, cfg router.APIConfig) *env {
	t.Helper()
	e.api = router.NewAPI(e.router, cfg)
	e.url = startHTTP(t, e.api)
	return e
}

// startHTTP serves h until t ends; event streams end first (Close).
func startHTTP(t *testing.T, h *router.API) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close) // runs before srv.Close
	return srv.URL
}

// cleanRedis deletes the keys under prefix when t ends.
func cleanRedis(t *testing.T, url, prefix string) {
	opts, _ := redis.ParseURL(url)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() {
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
}

// device returns a device id that no other test uses.
func device(what string) string { return what + "-" + testsvc.RandomHex(4) }

// testLogger writes to t.Log until t ends, and drops what comes later.
func testLogger(t *testing.T, component string) *slog.Logger {
	return testsvc.Logger(t).With("c", component)
}

// ctxFor is a context that ends with t or after d.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// phone connects a phone to the node as dev.
func (e *env) phone(t *testing.T, dev string) *client.Conn {
	t.Helper()
	return e.phoneWith(t, dev, client.Options{Timeout: 5 * time.Second})
}

// phoneWith is phone with the client's options.
func (e *env) phoneWith(t *testing.T, dev string, opts client.Options) *client.Conn {
	t.Helper()
	return phoneOn(t, e.node, dev, opts)
}

// phoneOn connects a phone to node g as dev.
func phoneOn(t *testing.T, g *gateway.Gateway, dev string, opts client.Options) *client.Conn {
	t.Helper()
	c, err := client.Dial(ctxFor(t, 10*time.Second), g.URL(), opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if _, err := c.Hello(ctxFor(t, 10*time.Second), phoneToken, protocol.Device{ID: dev, Name: "Phone"}, protocol.User{ID: "u-1", Name: "Tester"}); err != nil {
		t.Fatalf("hello as %s: %v", dev, err)
	}
	return c
}

// expect waits for the next frame of type typ on c.
func expect(t *testing.T, c *client.Conn, typ string) client.Frame {
	t.Helper()
	f, err := c.Expect(ctxFor(t, 10*time.Second), typ)
	if err != nil {
		t.Fatalf("waiting for %s: %v", typ, err)
	}
	return f
}

// response is an answer of the API.
type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body as an object.
func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer %d is not a JSON object: %v: %s", r.status, err, r.body)
	}
	return m
}

// call makes a request to the API; body is JSON-encoded unless it is a
// string or []byte, sent as it is. An empty token sends no Authorization.
func (e *env) call(t *testing.T, method, path, token string, body any) response {
	t.Helper()
	return callURL(t, e.url, method, path, token, body, nil)
}

func callURL(t *testing.T, base, method, path, token string, body any, header http.Header) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctxFor(t, 40*time.Second), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return response{resp.StatusCode, resp.Header, data}
}

// wantOK checks a 200 {"ok":true,…} answer and returns it.
func wantOK(t *testing.T, r response) map[string]any {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", r.status, r.body)
	}
	m := r.json(t)
	if m["ok"] != true {
		t.Fatalf("answer %s, want ok true", r.body)
	}
	return m
}

// wantError checks an error answer: the status and {"error": code, "message": …}.
func wantError(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.status, status, code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error answer Content-Type %q, want application/json", ct)
	}
	m := r.json(t)
	if m["error"] != code {
		t.Fatalf("error %v, want %q: %s", m["error"], code, r.body)
	}
	if msg, _ := m["message"].(string); msg == "" {
		t.Fatalf("error answer without a message: %s", r.body)
	}
}

// loggedEvent is an entry of GET /v1/events as JSON.
type loggedEvent struct {
	Cursor string     `json:"cursor"`
	Event  wire.Event `json:"event"`
}

// readEvents makes one JSON read of the event log.
func (e *env) readEvents(t *testing.T, query string) ([]loggedEvent, string) {
	t.Helper()
	r := e.call(t, "GET", "/v1/events?"+query, agentToken, nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /v1/events?%s: %d %s", query, r.status, r.body)
	}
	var body struct {
		Events []loggedEvent `json:"events"`
		Cursor *string       `json:"cursor"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.Events == nil || body.Cursor == nil {
		t.Fatalf("GET /v1/events?%s answered %s (%v), want events and cursor", query, r.body, err)
	}
	return body.Events, *body.Cursor
}

// waitEvents reads the log after cursor until n events came, and returns
// them and the cursor of the last.
func (e *env) waitEvents(t *testing.T, cursor string, n int) ([]loggedEvent, string) {
	t.Helper()
	var got []loggedEvent
	deadline := time.Now().Add(15 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events came within 15 s: %+v", len(got), n, got)
		}
		es, next := e.readEvents(t, fmt.Sprintf("cursor=%s&wait=5&max=%d", cursor, n-len(got)))
		got = append(got, es...)
		cursor = next
	}
	return got, cursor
}

// sseEvent is one event of a stream.
type sseEvent struct {
	id, event, data string
}

// sseStream reads an event stream in the background.
type sseStream struct {
	resp     *http.Response
	events   chan sseEvent
	comments chan string
}

// openStream opens GET /v1/events?query as an event stream.
func (e *env) openStream(t *testing.T, query string, header http.Header) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+agentToken)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("open event stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("event stream: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	s := &sseStream{resp: resp, events: make(chan sseEvent, 100), comments: make(chan string, 100)}
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	go s.read()
	return s
}

func (s *sseStream) read() {
	defer close(s.events)
	sc := bufio.NewScanner(s.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.data != "" {
				s.events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			select {
			case s.comments <- strings.TrimSpace(line[1:]):
			default:
			}
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.id = value
			case "event":
				ev.event = value
			case "data":
				ev.data += value
			}
		}
	}
}

// next returns the next event, decoded.
func (s *sseStream) next(t *testing.T) (sseEvent, wire.Event) {
	t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			t.Fatal("the event stream ended")
		}
		var w wire.Event
		if err := json.Unmarshal([]byte(ev.data), &w); err != nil {
			t.Fatalf("event data is not a wire.Event: %v: %q", err, ev.data)
		}
		return ev, w
	case <-time.After(15 * time.Second):
		t.Fatal("no event on the stream within 15 s")
	}
	panic("unreachable")
}

// none checks that no event comes for d.
func (s *sseStream) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev, ok := <-s.events:
		if ok {
			t.Fatalf("unexpected event %+v", ev)
		}
	case <-time.After(d):
	}
}
