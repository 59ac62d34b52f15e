package router_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

func requests(route, method, class string) string {
	return `hermes_http_requests_total{method="` + method + `",route="` + route + `",status_class="` + class + `"}`
}

func durationCount(route, method string, status int) string {
	r := ""
	if route != "" {
		r = `,http_route="` + route + `"`
	}
	return `http_server_request_duration_seconds_count{http_request_method="` + method + `",http_response_status_code="` +
		strconv.Itoa(status) + `"` + r + `,url_scheme="http"}`
}

// TestHTTPMetrics: every endpoint of the API is counted at 0 from the
// start, for its methods and the classes 2xx, 4xx and 5xx; each answer
// then counts under its route (other for an unknown path), method (_OTHER
// for one HTTP does not define) and class, and its duration under the
// semantic-convention histogram with the exact status.
func TestHTTPMetrics(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "hermes-router"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	nc := nodeConfig()
	nc.Router, nc.APIListen, nc.API, nc.Telemetry = true, "127.0.0.1:0", apiConfig(nil), tel
	g, err := gateway.Start(t.Context(), nc, testLogger(t, "node"))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	e := &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
	ms := httptest.NewServer(tel.Handler())
	t.Cleanup(ms.Close)
	metrics := ms.URL + "/metrics"

	fresh := testsvc.Scrape(t, metrics)
	for _, s := range []string{
		requests("/v1/deliver", "POST", "2xx"), requests("/v1/deliver", "POST", "4xx"), requests("/v1/deliver", "POST", "5xx"),
		requests("/v1/sessions/{session}/prompts/{id}", "DELETE", "2xx"),
		requests("/v1/events", "GET", "5xx"), requests("/v1/events", "HEAD", "2xx"),
		requests("/readyz", "GET", "5xx"), requests("/healthz", "HEAD", "4xx"),
	} {
		if v, ok := fresh[s]; !ok || v != 0 {
			t.Errorf("before any request %s = %v (present %v), want 0", s, v, ok)
		}
	}
	if _, ok := fresh[requests("/v1/deliver", "GET", "2xx")]; ok {
		t.Errorf("a method the endpoint does not answer has a series from the start")
	}

	wantOK(t, e.call(t, "GET", "/healthz", "", nil))
	wantOK(t, e.call(t, "GET", "/healthz", "", nil))
	wantError(t, e.call(t, "POST", "/v1/deliver", "wrong-token", map[string]any{"text": "hi"}), http.StatusUnauthorized, "auth_failed")
	wantError(t, e.call(t, "PUT", "/v1/deliver", deliverToken, nil), http.StatusMethodNotAllowed, "method_not_allowed")
	wantError(t, e.call(t, "BREW", "/v1/deliver", deliverToken, nil), http.StatusMethodNotAllowed, "method_not_allowed")
	wantError(t, e.call(t, "GET", "/v1/no-such-thing", "", nil), http.StatusNotFound, "not_found")
	wantError(t, e.call(t, "GET", "/v1/events?max=0", agentToken, nil), http.StatusBadRequest, "bad_frame")
	// A router that is shutting down is not ready: 503.
	g.Router.Close()
	if r := e.call(t, "GET", "/readyz", "", nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz of a closed router: %d %s", r.status, r.body)
	}

	m := testsvc.Scrape(t, metrics)
	for s, want := range map[string]float64{
		requests("/healthz", "GET", "2xx"):          2,
		requests("/healthz", "GET", "4xx"):          0,
		requests("/v1/deliver", "POST", "4xx"):      1,
		requests("/v1/deliver", "POST", "2xx"):      0,
		requests("/v1/deliver", "PUT", "4xx"):       1,
		requests("/v1/deliver", "_OTHER", "4xx"):    1,
		requests("other", "GET", "4xx"):             1,
		requests("/v1/events", "GET", "4xx"):        1,
		requests("/readyz", "GET", "5xx"):           1,
		requests("/readyz", "GET", "2xx"):           0,
		durationCount("/healthz", "GET", 200):       2,
		durationCount("/v1/deliver", "POST", 401):   1,
		durationCount("/v1/deliver", "_OTHER", 405): 1,
		durationCount("", "GET", 404):               1,
		durationCount("/readyz", "GET", 503):        1,
	} {
		if v, ok := m[s]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", s, v, ok, want)
		}
	}
	for s := range m {
		if strings.Contains(s, "BREW") || strings.Contains(s, "no-such-thing") {
			t.Errorf("a client-chosen value became a label: %s", s)
		}
	}
}
