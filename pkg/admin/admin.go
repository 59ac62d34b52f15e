// Package admin is a service's operations port (MOBILE_ADMIN_LISTEN): a
// small HTTP server, apart from the traffic a service carries, that answers
// /healthz (the process is alive), /readyz (it should get traffic) and
// whatever else is mounted on it with Handle, such as /metrics.
//
// /readyz follows the service's state. A Server starts in StateStarting
// and answers 503 until MarkReady; once ready it answers 200 when every
// check registered with AddCheck passes (Redis, NATS), 503 naming the
// failed ones otherwise; after MarkDraining it answers 503 at once, without
// running the checks, so a load balancer stops sending new connections
// the moment shutdown begins.
//
// /healthz answers 200 unless a check registered with AddLiveCheck fails:
// those report what the process cannot recover from by itself (a NATS
// connection closed for good), so the orchestrator restarts it. They are
// not run while draining, when the service closes its connections itself.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Off is the listen address that disables the admin port.
const Off = "off"

// CheckTimeout bounds all checks of one /readyz request together.
const CheckTimeout = 2 * time.Second

// State is where a service is in its life, as /readyz reports it.
type State string

// The states, in the order a service goes through them.
const (
	StateStarting State = "starting" // not ready yet: dependencies are being set up
	StateReady    State = "ready"    // serving; /readyz runs the checks
	StateDraining State = "draining" // shutting down: no new traffic
)

// Check reports whether one dependency works; nil means it does.
type Check func(ctx context.Context) error

// Server is the admin HTTP server. The zero value is not usable; call New.
// Its methods are safe for concurrent use; Handle and AddCheck may be
// called before or after Start.
type Server struct {
	log   *slog.Logger
	mux   *http.ServeMux
	state atomic.Value // State

	mu           sync.Mutex
	checkTimeout time.Duration
	checks       map[string]Check
	live         map[string]func() error
	srv          *http.Server
	url          string
	served       chan error
}

// New returns a Server in StateStarting that serves /healthz and /readyz.
func New(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: log, mux: http.NewServeMux(), checkTimeout: CheckTimeout,
		checks: make(map[string]Check), live: make(map[string]func() error)}
	s.state.Store(StateStarting)
	s.mux.HandleFunc("GET /healthz", s.Healthz)
	s.mux.HandleFunc("GET /readyz", s.Readyz)
	return s
}

// Handle mounts h on pattern (http.ServeMux patterns).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// SetCheckTimeout bounds all checks of one /readyz request together
// (CheckTimeout by default).
func (s *Server) SetCheckTimeout(d time.Duration) {
	s.mu.Lock()
	s.checkTimeout = d
	s.mu.Unlock()
}

// AddCheck adds (or, under the same name, replaces) a readiness check.
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	s.checks[name] = c
	s.mu.Unlock()
}

// AddLiveCheck adds (or, under the same name, replaces) a liveness check:
// a quick test, without I/O, of something the process cannot recover from.
// While it returns an error, /healthz answers 503 naming it.
func (s *Server) AddLiveCheck(name string, c func() error) {
	s.mu.Lock()
	s.live[name] = c
	s.mu.Unlock()
}

// MarkReady moves a starting server to StateReady. A draining server stays
// draining.
func (s *Server) MarkReady() { s.state.CompareAndSwap(StateStarting, StateReady) }

// MarkDraining moves the server to StateDraining for good.
func (s *Server) MarkDraining() { s.state.Store(StateDraining) }

// State is the current state.
func (s *Server) State() State { return s.state.Load().(State) }

// Start listens on addr and serves in the background. An empty addr or
// Off serves nothing (URL is then ""), though Handle and the states still
// work.
func (s *Server) Start(addr string) error {
	if addr == "" || strings.EqualFold(addr, Off) {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.Serve(ln)
	return nil
}

// Serve serves on ln in the background; Close stops it.
func (s *Server) Serve(ln net.Listener) {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	s.mu.Lock()
	s.srv, s.url, s.served = srv, "http://"+ln.Addr().String(), served
	s.mu.Unlock()
	go func() { served <- srv.Serve(ln) }()
}

// URL is the base URL served, "http://host:port", or "" when nothing is.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Close stops serving, giving requests in flight a moment to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// health is the body of /healthz and /readyz.
type health struct {
	OK     bool              `json:"ok"`
	State  State             `json:"state"`
	Checks map[string]string `json:"checks,omitempty"` // name → "ok" or what failed
	Reason string            `json:"reason,omitempty"` // why not ready
}

// Healthz answers /healthz. Another server (the router's API) mounts it
// on its own mux, so both ports answer alike, in the same shape.
func (s *Server) Healthz(w http.ResponseWriter, _ *http.Request) {
	st := s.State()
	if st == StateDraining {
		WriteJSON(w, http.StatusOK, health{OK: true, State: st})
		return
	}
	s.mu.Lock()
	var failed []string
	for name, c := range s.live {
		if err := c(); err != nil {
			failed = append(failed, name+": "+err.Error())
		}
	}
	s.mu.Unlock()
	if len(failed) == 0 {
		WriteJSON(w, http.StatusOK, health{OK: true, State: st})
		return
	}
	sort.Strings(failed)
	reason := strings.Join(failed, "; ")
	s.log.Error("not alive", "reason", reason)
	WriteJSON(w, http.StatusServiceUnavailable, health{State: st, Reason: reason})
}

// Readyz answers /readyz; like Healthz, another server may mount it.
func (s *Server) Readyz(w http.ResponseWriter, req *http.Request) {
	st := s.State()
	switch st {
	case StateStarting:
		WriteJSON(w, http.StatusServiceUnavailable, health{State: st, Reason: "starting"})
		return
	case StateDraining:
		WriteJSON(w, http.StatusServiceUnavailable, health{State: st, Reason: "draining: shutting down"})
		return
	}
	results := s.runChecks(req.Context())
	body := health{OK: true, State: st, Checks: make(map[string]string, len(results))}
	var failed []string
	for name, err := range results {
		if err == nil {
			body.Checks[name] = "ok"
			continue
		}
		body.OK = false
		body.Checks[name] = err.Error()
		failed = append(failed, name+": "+err.Error())
	}
	if body.OK {
		WriteJSON(w, http.StatusOK, body)
		return
	}
	sort.Strings(failed)
	body.Reason = strings.Join(failed, "; ")
	s.log.Warn("not ready", "reason", body.Reason)
	WriteJSON(w, http.StatusServiceUnavailable, body)
}

// runChecks runs every check at once, within the check timeout.
func (s *Server) runChecks(ctx context.Context) map[string]error {
	s.mu.Lock()
	ctx, cancel := context.WithTimeout(ctx, s.checkTimeout)
	defer cancel()
	checks := make(map[string]Check, len(s.checks))
	for name, c := range s.checks {
		checks[name] = c
	}
	s.mu.Unlock()
	results := make(map[string]error, len(checks))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, c := range checks {
		wg.Go(func() {
			err := c(ctx)
			mu.Lock()
			results[name] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// WriteJSON answers status with v as JSON (and a newline, for curl),
// never cached: the one JSON writer of the admin port and the router's API.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // an API, not a page: "<token>" stays readable
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"internal_error","message":"encoding the answer failed"}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(buf.Bytes()) //nolint:errcheck // the client went away: nothing to tell it
}
