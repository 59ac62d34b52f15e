package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// otlpSink is a loopback OTLP/HTTP collector that keeps what it is sent.
type otlpSink struct {
	*httptest.Server
	mu     sync.Mutex
	bodies map[string][]byte // path → every body received, concatenated
}

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{bodies: make(map[string][]byte)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost {
			s.mu.Lock()
			s.bodies[r.URL.Path] = append(s.bodies[r.URL.Path], body...)
			s.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *otlpSink) got(path string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bodies[path]
}

// TestRunServesMetricsAndExportsOTLP runs the command with an admin port and
// OTEL_EXPORTER_OTLP_ENDPOINT, talks to it over a real socket, scrapes
// /metrics on the admin port and checks that traces and metrics reached the
// collector by the time run returned.
func TestRunServesMetricsAndExportsOTLP(t *testing.T) {
	clearEnv(t)
	sink := newOTLPSink(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")
	f := mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-drain-window=200ms", "-token=tok")
	url, _, stderr, stop := testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, f, stdout, stderr)
	})
	admin := testsvc.ListeningURL(t, stderr.String(), "admin listening")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	phone, err := client.Dial(ctx, url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctx, "tok", protocol.Device{ID: "tel-1"}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.Expect(ctx, protocol.TypeMessage); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics on the admin port: %s", resp.Status)
	}
	for _, want := range []string{
		`hermes_handshakes_total{result="ok"} 1`,
		`hermes_frames_in_total{type="text"} 1`,
		"hermes_handshake_duration_seconds_count 1",
		"hermes_connections 1",
		"go_goroutines ",
		"process_resident_memory_bytes ",
		`service_name="hermes-edge"`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The phone leaves before the edge stops, so the gauge can be seen at 0.
	phone.Close()
	testsvc.WaitMetric(t, 5*time.Second, admin+"/metrics", "hermes_connections", testsvc.Equals(0))
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	// Shutdown flushed both exporters before run returned.
	traces, metrics := sink.got("/v1/traces"), sink.got("/v1/metrics")
	for _, name := range []string{"edge.event", "router.event", "agent.handle", "edge.deliver", "hermes-edge"} {
		if !bytes.Contains(traces, []byte(name)) {
			t.Errorf("the exported traces lack %q", name)
		}
	}
	if !bytes.Contains(metrics, []byte("hermes_frames_in")) {
		t.Error("the exported metrics lack hermes_frames_in")
	}
}

// TestFreshEdgeServesEveryDocumentedSeries: an edge that has served
// nothing yet already serves every counter and gauge docs/metrics.md lists
// for it (a histogram appears with its first observation): a single node,
// every series but those of the router's HTTP API and of Redis, which it
// does not use; an edge of a cluster (Redis, NATS, no router), those of
// Redis too.
func TestFreshEdgeServesEveryDocumentedSeries(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := documentedSeries.FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 10 {
		t.Fatalf("docs/metrics.md lists %d metrics; the table was not found", len(rows))
	}
	for _, tc := range []struct {
		name  string
		args  func(t *testing.T) []string
		sides map[string]bool
	}{
		{"single", func(*testing.T) []string { return nil }, map[string]bool{"edge": true, "router": true, "both": true}},
		{"cluster", func(t *testing.T) []string {
			suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
			return []string{"-nats-url=" + testsvc.NATSURL(t), "-nats-prefix=fresh" + suffix + ".",
				"-redis-url=" + testsvc.RedisURL(t), "-redis-prefix=hermes-fresh:" + suffix + ":", "-router=off",
				"-redis-pool-size=5"}
		}, map[string]bool{"edge": true, "both": true, "Redis": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			args := append([]string{"-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-drain-window=200ms", "-token=tok"}, tc.args(t)...)
			f := mustParse(t, args...)
			_, _, stderr, _ := testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
				return run(ctx, f, stdout, stderr)
			})
			admin := testsvc.ListeningURL(t, stderr.String(), "admin listening")
			resp, err := http.Get(admin + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			checked := 0
			for _, r := range rows {
				name, kind, side := r[1], r[2], r[3]
				if !tc.sides[side] {
					// The series of a part this process does not run
					// (the router, its API) are not served.
					if side == "router" && regexp.MustCompile("(?m)^"+name+"[{ ]").Match(body) {
						t.Errorf("%s (%s) is served by a process without a router", name, side)
					}
					continue
				}
				series := freshValue(name, kind)
				if series == nil {
					continue
				}
				checked++
				if !series.Match(body) {
					t.Errorf("%s (%s, %s) is documented but a fresh edge does not serve it at %s", name, kind, side, series)
				}
			}
			if checked < 10 {
				t.Errorf("only %d documented series checked", checked)
			}
			if tc.sides["Redis"] && !strings.Contains(string(body), "\nhermes_redis_pool_max_connections 5\n") {
				t.Error("-redis-pool-size=5 did not reach the Redis client: hermes_redis_pool_max_connections is not 5")
			}
		})
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
