package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
)

// start serves a new admin server on a free loopback port.
func start(t *testing.T) *admin.Server {
	t.Helper()
	s := admin.New(nil)
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if !strings.HasPrefix(s.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL() = %q", s.URL())
	}
	return s
}

type answer struct {
	OK     bool              `json:"ok"`
	State  string            `json:"state"`
	Checks map[string]string `json:"checks"`
	Reason string            `json:"reason"`
}

func get(t *testing.T, url string) (int, answer) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("GET %s: %d %q is not JSON: %v", url, resp.StatusCode, raw, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET %s: Content-Type %q", url, ct)
	}
	return resp.StatusCode, a
}

func TestReadinessFollowsTheState(t *testing.T) {
	s := start(t)
	var fail atomic.Bool
	s.AddCheck("dep", func(context.Context) error {
		if fail.Load() {
			return errors.New("boom")
		}
		return nil
	})

	if code, a := get(t, s.URL()+"/healthz"); code != 200 || !a.OK {
		t.Fatalf("/healthz while starting: %d %+v, want 200 ok", code, a)
	}
	if code, a := get(t, s.URL()+"/readyz"); code != 503 || a.OK || a.State != "starting" || a.Reason == "" {
		t.Fatalf("/readyz while starting: %d %+v, want 503 starting with a reason", code, a)
	}
	s.MarkReady()
	if code, a := get(t, s.URL()+"/readyz"); code != 200 || !a.OK || a.State != "ready" || a.Checks["dep"] != "ok" {
		t.Fatalf("/readyz when ready: %d %+v, want 200 with dep ok", code, a)
	}
	fail.Store(true)
	if code, a := get(t, s.URL()+"/readyz"); code != 503 || a.OK || a.Checks["dep"] != "boom" || !strings.Contains(a.Reason, "dep: boom") {
		t.Fatalf("/readyz with a failing check: %d %+v, want 503 naming dep", code, a)
	}
	fail.Store(false)

	// Draining answers at once, without waiting for the checks.
	s.AddCheck("slow", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	s.MarkDraining()
	begin := time.Now()
	if code, a := get(t, s.URL()+"/readyz"); code != 503 || a.State != "draining" || !strings.Contains(a.Reason, "draining") {
		t.Fatalf("/readyz while draining: %d %+v, want 503 draining", code, a)
	}
	if d := time.Since(begin); d > time.Second {
		t.Fatalf("/readyz while draining took %v", d)
	}
	s.MarkReady() // too late: draining is for good
	if s.State() != admin.StateDraining {
		t.Fatalf("state %q after MarkReady while draining", s.State())
	}
	if code, _ := get(t, s.URL()+"/healthz"); code != 200 {
		t.Fatalf("/healthz while draining: %d, want 200 (the process lives)", code)
	}
}

func TestSlowCheckTimesOut(t *testing.T) {
	s := start(t)
	s.AddCheck("hangs", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	s.MarkReady()
	begin := time.Now()
	code, a := get(t, s.URL()+"/readyz")
	if code != 503 || a.Checks["hangs"] == "ok" {
		t.Fatalf("/readyz with a hanging check: %d %+v, want 503", code, a)
	}
	if d := time.Since(begin); d < admin.CheckTimeout || d > admin.CheckTimeout+time.Second {
		t.Fatalf("/readyz took %v, want about CheckTimeout (%v)", d, admin.CheckTimeout)
	}
}

func TestHandleBeforeAndAfterStart(t *testing.T) {
	s := admin.New(nil)
	s.Handle("/before", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "b") }))
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Handle("/after", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "a") }))
	for path, want := range map[string]string{"/before": "b", "/after": "a"} {
		resp, err := http.Get(s.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
	}
	if resp, err := http.Get(s.URL() + "/nothing"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("GET /nothing: %v %v, want 404", resp, err)
	}
}

func TestOff(t *testing.T) {
	for _, addr := range []string{"off", "OFF", ""} {
		s := admin.New(nil)
		if err := s.Start(addr); err != nil {
			t.Fatalf("Start(%q): %v", addr, err)
		}
		if s.URL() != "" {
			t.Fatalf("Start(%q) serves %s", addr, s.URL())
		}
		s.Handle("/metrics", http.NotFoundHandler()) // still allowed
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.New(nil).Start("127.0.0.1:notaport"); err == nil {
		t.Fatal("Start with a bad address succeeded")
	}
}

// TestStoreAndBusChecks runs the checks against a real store and a real
// (embedded) NATS, and against that NATS once it is gone.
func TestStoreAndBusChecks(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(memstore.Options{})
	defer st.Close()
	if err := admin.StoreCheck(st)(ctx); err != nil {
		t.Fatalf("StoreCheck on a working store: %v", err)
	}
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	check := admin.BusCheck(b)
	if err := check(ctx); err != nil {
		t.Fatalf("BusCheck on a working bus: %v", err)
	}
	b.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := check(cctx); err == nil {
		t.Fatal("BusCheck passes on a closed bus")
	}
}

// TestHealthzFailsWhenTheBusIsClosedForGood: a server that closes the
// connection over a protocol error leaves nats.go closed for good; /healthz
// then answers 503 naming the bus, so the process is restarted.
func TestHealthzFailsWhenTheBusIsClosedForGood(t *testing.T) {
	srv, err := server.NewServer(&server.Options{DontListen: true, MaxControlLine: 256})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	b, err := natsbus.ConnectInProcess(srv, natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	s := start(t)
	s.AddLiveCheck("bus", admin.BusLive(b))
	s.MarkReady()
	if code, a := get(t, s.URL()+"/healthz"); code != 200 || !a.OK {
		t.Fatalf("/healthz with a live bus: %d %+v", code, a)
	}
	_ = b.Publish(context.Background(), strings.Repeat("x", 300), nil, nil)
	var code int
	var a answer
	if !testsvc.Eventually(10*time.Second, func() bool {
		code, a = get(t, s.URL()+"/healthz")
		return code == 503 && !a.OK && strings.HasPrefix(a.Reason, "bus: ")
	}) {
		t.Fatalf("/healthz after the bus closed for good: %d %+v, want 503 naming bus", code, a)
	}
	s.MarkDraining()
	if code, _ := get(t, s.URL()+"/healthz"); code != 200 {
		t.Fatalf("/healthz while draining: %d, want 200", code)
	}
}

func TestPprofOnlyWhenMounted(t *testing.T) {
	s := start(t)
	resp, err := http.Get(s.URL() + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /debug/pprof/ without HandlePprof: %d, want 404", resp.StatusCode)
	}

	s.HandlePprof()
	resp, err = http.Get(s.URL() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile:") {
		t.Fatalf("GET /debug/pprof/goroutine?debug=1: %d %.200q", resp.StatusCode, body)
	}
	// A CPU profile is a gzipped protobuf.
	resp, err = http.Get(s.URL() + "/debug/pprof/profile?seconds=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b {
		t.Fatalf("GET /debug/pprof/profile?seconds=1: %d, %d bytes, want a gzipped profile", resp.StatusCode, len(body))
	}
	// The command line may hold a secret given as a flag.
	resp, err = http.Get(s.URL() + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "admin.test") {
		t.Fatalf("GET /debug/pprof/cmdline serves the command line: %d %.200q", resp.StatusCode, body)
	}
}

func TestPprofSetting(t *testing.T) {
	for v, want := range map[string]bool{"on": true, " ON ": true, "off": false, "": false, "Off": false} {
		if got, err := admin.PprofSetting(v); err != nil || got != want {
			t.Errorf("PprofSetting(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := admin.PprofSetting("yes"); err == nil || !strings.Contains(err.Error(), "MOBILE_PPROF") {
		t.Errorf("PprofSetting(yes) = %v, want an error naming MOBILE_PPROF", err)
	}
}
