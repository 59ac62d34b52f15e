package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestRunServesMetrics: the router's admin port serves /metrics with the
// runtime collectors and the router's own metrics, which move when the
// demo agent answers a phone on an edge of the same cluster.
func TestRunServesMetrics(t *testing.T) {
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	rurl := testsvc.RedisURL(t)
	nurl := testsvc.NATSURL(t)
	prefix := uniquePrefix(t, rurl)
	subjects := "rt" + strings.Trim(strings.TrimPrefix(prefix, "hermes-routermain"), ":") + "."
	f := mustParse(t, "-listen=127.0.0.1:0", "-nats-url="+nurl, "-nats-prefix="+subjects, "-redis-url="+rurl,
		"-redis-prefix="+prefix, "-admin-listen=127.0.0.1:0")
	_, logs, _ := runRouter(t, f)
	admin := testsvc.ListeningURL(t, logs.String(), "admin listening")

	node, err := gateway.Start(context.Background(), gateway.Config{
		Listen: "127.0.0.1:0", NATSURL: nurl, NATSPrefix: subjects, RedisURL: rurl, RedisPrefix: prefix,
		Edge: edge.Config{Auth: edge.AuthConfig{Token: "phone-token"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	ctx := ctxFor(t, 15*time.Second)
	phone, err := client.Dial(ctx, node.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctx, "phone-token", protocol.Device{ID: "tel-1"}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
		t.Fatal(err)
	}

	var body string
	testsvc.Eventually(10*time.Second, func() bool { // judged below
		body = testsvc.ScrapeText(t, admin+"/metrics")
		return strings.Contains(body, "hermes_delivery_latency_seconds_count")
	})
	for _, want := range []string{
		"hermes_delivery_latency_seconds_count ",
		"go_goroutines ",
		"process_resident_memory_bytes ",
		`service_name="hermes-router"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "hermes_delivery_latency_seconds_count 0") {
		t.Error("the router delivered an answer but counted no delivery")
	}
}

// TestFreshRouterServesEveryDocumentedSeries mirrors the edge's
// TestFreshEdgeServesEveryDocumentedSeries: a running router with
// AGENT=openai that has served nothing yet already serves every counter
// and gauge docs/metrics.md lists for the router, both sides, the router's
// HTTP API, Redis and the openai agent (a histogram appears with its first
// observation), and its Redis pool has the REDIS_POOL_SIZE it was given.
func TestFreshRouterServesEveryDocumentedSeries(t *testing.T) {
	clearEnv(t)
	t.Setenv("AGENT", "openai")
	t.Setenv("OPENAI_MODEL", "test-model")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1") // never called
	t.Setenv("REDIS_POOL_SIZE", "6")
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := documentedSeries.FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 10 {
		t.Fatalf("docs/metrics.md lists %d metrics; the table was not found", len(rows))
	}
	rurl := testsvc.RedisURL(t)
	prefix := uniquePrefix(t, rurl)
	subjects := "fr" + strings.Trim(strings.TrimPrefix(prefix, "hermes-routermain"), ":") + "."
	f := mustParse(t, "-listen=127.0.0.1:0", "-nats-url="+testsvc.NATSURL(t), "-nats-prefix="+subjects, "-redis-url="+rurl,
		"-redis-prefix="+prefix, "-admin-listen=127.0.0.1:0")
	_, logs, _ := runRouter(t, f)
	admin := testsvc.ListeningURL(t, logs.String(), "admin listening")
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sides := map[string]bool{"router": true, "both": true, "router API": true, "Redis": true, "openai": true}
	checked := 0
	for _, r := range rows {
		name, kind, side := r[1], r[2], r[3]
		if side == "edge" && regexp.MustCompile("(?m)^"+name+"[{ ]").Match(body) {
			t.Errorf("%s (%s) is served by a router, which runs no edge", name, side)
		}
		series := freshValue(name, kind)
		if series == nil || !sides[side] {
			continue
		}
		checked++
		if !series.Match(body) {
			t.Errorf("%s (%s, %s) is documented but a fresh router does not serve it at %s", name, kind, side, series)
		}
	}
	if checked < 10 {
		t.Errorf("only %d documented series checked", checked)
	}
	// Each endpoint of the API, with the classes an alert divides by.
	for _, want := range []string{
		`hermes_http_requests_total{method="POST",route="/v1/deliver",status_class="5xx"} 0`,
		`hermes_http_requests_total{method="GET",route="/v1/events",status_class="2xx"} 0`,
		`hermes_http_requests_total{method="GET",route="/readyz",status_class="5xx"} 0`,
		"hermes_redis_pool_max_connections 6",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// documentedSeries matches a row of docs/metrics.md's tables: name, type
// and side.
var documentedSeries = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (counter|gauge|histogram) \\|[^|]*\\| ([a-zA-Z ]+) \\|")

// freshValue matches a series of name at the value a fresh process has:
// 1 for hermes_build_info, any count for the Redis pool's gauges and for
// its hits and misses (the connection's first PING is one), a positive
// number for the limits (of the budgets, of the Redis pool), 0 for the
// rest. Of a histogram, it matches the count: at least 1 for
// hermes_redis_command_duration_seconds (the first PING), and nil for the
// others, which appear with their first observation.
func freshValue(name, kind string) *regexp.Regexp {
	value := "0"
	switch name {
	case "hermes_build_info":
		value = "1"
	case "hermes_redis_pool_connections", "hermes_redis_pool_idle_connections",
		"hermes_redis_pool_hits_total", "hermes_redis_pool_misses_total":
		value = "[0-9]+"
	case "hermes_budget_limit_bytes", "hermes_redis_pool_max_connections", "hermes_redis_command_duration_seconds":
		value = "[1-9][0-9.e+]*" // large ones print as 2.68435456e+08
	}
	if kind == "histogram" {
		if name != "hermes_redis_command_duration_seconds" {
			return nil
		}
		name += "_count"
	}
	return regexp.MustCompile("(?m)^" + regexp.QuoteMeta(name) + "(\\{[^}]*\\})? " + value + "$")
}

// TestAPIRequestLog: every request to the router's API is one JSON line
// with its method, route (the pattern, not the path, which names a
// session; other for an unknown path), status, client address and
// duration in seconds: at info level when refused (400 and above), at
// debug level when answered.
func TestAPIRequestLog(t *testing.T) {
	clearEnv(t)
	rurl := testsvc.RedisURL(t)
	prefix := uniquePrefix(t, rurl)
	subjects := "al" + strings.Trim(strings.TrimPrefix(prefix, "hermes-routermain"), ":") + "."
	f := mustParse(t, "-listen=127.0.0.1:0", "-nats-url="+testsvc.NATSURL(t), "-nats-prefix="+subjects, "-redis-url="+rurl,
		"-redis-prefix="+prefix, "-admin-listen=off", "-agent-tokens=agent-token", "-log-level=debug")
	url, logs, _ := runRouter(t, f)
	if code, _ := call(t, "GET", url+"/healthz", "", ""); code != http.StatusOK {
		t.Fatalf("GET /healthz: %d, want 200", code)
	}
	if code, _ := call(t, "POST", url+"/v1/sessions/mobile:secret-device/messages", "", `{"text":"hi"}`); code != http.StatusUnauthorized {
		t.Fatalf("POST without a token: %d, want 401", code)
	}
	if code, _ := call(t, "GET", url+"/no/such/path", "", ""); code != http.StatusNotFound {
		t.Fatalf("GET of an unknown path: %d, want 404", code)
	}
	want := []struct {
		level, method, route string
		status               float64
	}{
		{"DEBUG", "GET", "/healthz", 200},
		{"INFO", "POST", "/v1/sessions/{session}/messages", 401},
		{"INFO", "GET", "other", 404},
	}
	var lines []map[string]any
	testsvc.Eventually(5*time.Second, func() bool {
		lines = lines[:0]
		for line := range strings.Lines(logs.String()) {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "api request" {
				lines = append(lines, m)
			}
		}
		return len(lines) >= len(want)
	}) // the count is checked below, with the log
	if len(lines) != len(want) {
		t.Fatalf("%d api request lines, want %d:\n%s", len(lines), len(want), logs.String())
	}
	for i, w := range want {
		m := lines[i]
		d, ok := m["duration"].(float64)
		client, _ := m["client"].(string)
		if m["level"] != w.level || m["method"] != w.method || m["route"] != w.route || m["status"] != w.status ||
			!strings.HasPrefix(client, "127.0.0.1:") || !ok || d < 0 || d > 30 {
			t.Errorf("api request line %v; want level %s, method %s, route %s, status %v, a loopback client and a duration in seconds",
				m, w.level, w.method, w.route, w.status)
		}
	}
	if strings.Contains(logs.String(), "secret-device") {
		t.Error("the log names the session of the path")
	}
}
