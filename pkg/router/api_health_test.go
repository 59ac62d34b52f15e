package router_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

func TestHealth(t *testing.T) {
	eachEnv(t, nil, func(t *testing.T, e *env) {
		wantOK(t, e.call(t, "GET", "/healthz", "", nil))
		r := e.call(t, "GET", "/readyz", "", nil)
		wantChecks(t, wantOK(t, r), "ok", "store", "bus", "router")
	})
}

// wantChecks checks that a /readyz answer has the admin port's shape, state
// "ready", and that each named check is "ok" (want "ok") or failed (want "").
func wantChecks(t *testing.T, m map[string]any, want string, names ...string) {
	t.Helper()
	if m["state"] != "ready" {
		t.Fatalf("readyz %v: want state ready", m)
	}
	checks, _ := m["checks"].(map[string]any)
	for _, n := range names {
		v, _ := checks[n].(string)
		if (want == "ok") != (v == "ok") || v == "" {
			t.Fatalf("readyz %v: check %s = %q, want %s", m, n, v, map[bool]string{true: "ok", false: "failed, saying why"}[want == "ok"])
		}
	}
}

// TestNotReady: /readyz says what fails, within its timeout, in the admin
// port's shape; /healthz still answers.
func TestNotReady(t *testing.T) {
	e := startSingle(t, router.APIConfig{})
	check := func(t *testing.T, st store.Store, want ...string) {
		t.Helper()
		b, err := natsbus.Embedded(natsbus.Options{})
		if err != nil {
			t.Fatal(err)
		}
		b.Close() // a bus that is gone
		r := router.New(router.Config{}, st, b, agent.Demo{}, nil)
		url := startHTTP(t, router.NewAPI(r, router.APIConfig{ReadyTimeout: 500 * time.Millisecond}))
		start := time.Now()
		res := callURL(t, url, "GET", "/readyz", "", nil, nil)
		if took := time.Since(start); took > testsvc.Slack(2*time.Second) {
			t.Fatalf("readyz took %v with a 500ms timeout", took)
		}
		if res.status != http.StatusServiceUnavailable {
			t.Fatalf("readyz: %d %s, want 503", res.status, res.body)
		}
		m := res.json(t)
		if m["ok"] != false || m["reason"] == "" {
			t.Fatalf("readyz %s: want ok false and a reason", res.body)
		}
		wantChecks(t, m, "", want...)
		// The bus connection is closed for good: the process cannot
		// recover by itself, so /healthz fails too, naming it.
		if h := callURL(t, url, "GET", "/healthz", "", nil, nil); h.status != http.StatusServiceUnavailable || !strings.Contains(string(h.body), "bus") {
			t.Fatalf("healthz with a closed bus: %d %s, want 503 naming the bus", h.status, h.body)
		}
	}
	t.Run("bus", func(t *testing.T) {
		check(t, e.store, "bus")
		wantChecks(t, wantOK(t, callURL(t, e.url, "GET", "/readyz", "", nil, nil)), "ok", "store", "bus")
	})
	t.Run("store and bus", func(t *testing.T) {
		url := testsvc.RedisURL(t)
		st, err := redisstore.New(t.Context(), redisstore.Options{URL: url, Prefix: "hermes-routertest:" + testsvc.RandomHex(6) + ":"})
		if err != nil {
			t.Fatal(err)
		}
		st.Close() // a store that is gone
		check(t, st, "store", "bus")
	})
	t.Run("router closed", func(t *testing.T) {
		r := router.New(router.Config{}, e.store, e.node.Bus, agent.Demo{}, nil)
		url := startHTTP(t, router.NewAPI(r, router.APIConfig{}))
		r.Close()
		res := callURL(t, url, "GET", "/readyz", "", nil, nil)
		if res.status != http.StatusServiceUnavailable || !strings.Contains(string(res.body), "shutting down") {
			t.Fatalf("readyz of a closed router: %d %s, want 503 saying it shuts down", res.status, res.body)
		}
		wantChecks(t, res.json(t), "", "router")
		wantOK(t, callURL(t, url, "GET", "/healthz", "", nil, nil))
	})
}

// TestUnavailable: when Redis cannot be reached, the API says so with 503
// internal_error and Retry-After, which a client retries.
func TestUnavailable(t *testing.T) {
	url := testsvc.RedisURL(t)
	st, err := redisstore.New(t.Context(), redisstore.Options{URL: url, Prefix: "hermes-routertest:" + testsvc.RandomHex(6) + ":"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Retried for RetryFor before the outbox is tried (and fails too).
	r := router.New(router.Config{RetryFor: 300 * time.Millisecond}, st, b, agent.NewLink(st, 0), testLogger(t, "router"))
	api := startHTTP(t, router.NewAPI(r, apiConfig(nil)))
	for _, c := range []struct {
		method, path, token string
		body                any
	}{
		{"POST", "/v1/deliver", deliverToken, map[string]any{"target": "tel-1", "text": "x"}},
		{"POST", "/v1/sessions/tel-1/messages", agentToken, map[string]any{"text": "x"}},
		{"POST", "/v1/sessions/tel-1/prompts", agentToken, map[string]any{"kind": "slash_confirm", "text": "x"}},
		{"GET", "/v1/events?wait=1", agentToken, nil},
		{"GET", "/v1/events", agentToken, nil},
		{"GET", "/v1/blobs/0123456789abcdef0123456789abcdef", agentToken, nil},
	} {
		res := callURL(t, api, c.method, c.path, c.token, c.body, nil)
		wantError(t, res, http.StatusServiceUnavailable, "internal_error")
		if res.header.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", c.method, c.path)
		}
	}
}
