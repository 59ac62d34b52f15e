package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
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
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "hermes_connections 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hermes_connections did not return to 0 after the phone closed")
		}
	}
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

// TestFreshEdgeServesEveryDocumentedSeries: a single node that has served
// nothing yet already serves every counter and gauge docs/metrics.md lists,
// at 0 (a histogram appears with its first observation), but those of the
// router's HTTP API and of Redis, which it does not use.
func TestFreshEdgeServesEveryDocumentedSeries(t *testing.T) {
	clearEnv(t)
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (counter|gauge|histogram) \\|[^|]*\\| ([a-zA-Z ]+) \\|")
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) < 10 {
		t.Fatalf("docs/metrics.md lists %d metrics; the table was not found", len(rows))
	}

	f := mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-drain-window=200ms", "-token=tok")
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
	for _, r := range rows {
		name, kind, side := r[1], r[2], r[3]
		if kind == "histogram" || side == "router API" || side == "Redis" {
			continue
		}
		value := "0" // counters and hermes_connections
		if name == "hermes_build_info" {
			value = "1"
		}
		series := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(name) + "(\\{[^}]*\\})? " + value + "$")
		if !series.Match(body) {
			t.Errorf("%s (%s) is documented but a fresh edge does not serve it at %s", name, kind, value)
		}
	}
}
