package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	return string(b)
}

func TestHandlerExposesNamesAndRuntime(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "hermes-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := tel.Metrics()
	m.NATSConnected()
	m.NATSDisconnected()
	m.ObserveRedis(func() telemetry.PoolStats { return telemetry.PoolStats{Hits: 7, Conns: 2} })
	m.RedisError(telemetry.RedisFull)
	m.RedisError("no-such-kind") // counted as other: a caller cannot add series

	body := scrape(t, tel.Handler())
	for _, want := range []string{
		"hermes_nats_disconnects_total 1",
		"hermes_nats_reconnects_total 0",
		"hermes_redis_pool_hits_total 7",
		"hermes_redis_pool_connections 2",
		`hermes_redis_errors_total{kind="full"} 1`,
		`hermes_redis_errors_total{kind="other"} 1`,
		`hermes_redis_errors_total{kind="unavailable"} 0`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
		`service_name="hermes-test"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "no-such-kind") {
		t.Error("a caller-chosen kind became a label value")
	}
	if strings.Contains(body, "hermes_frames_in_total") || strings.Contains(body, "hermes_journal_dropped_total") {
		t.Error("a process without an edge or a router serves their series")
	}
	if t.Failed() {
		t.Log(body)
	}
}

func TestNilTelemetryIsANoOp(t *testing.T) {
	var tel *telemetry.Telemetry
	tel.Metrics().NATSDisconnected()
	tel.Metrics().RedisError(telemetry.RedisFull)
	c, err := tel.Meter().Int64Counter("hermes_test")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1)
	_, span := tel.Tracer("x").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Error("a nil Telemetry records spans")
	}
	span.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestNoExporterMeansNoTracing(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx, span := tel.Tracer("x").Start(context.Background(), "s")
	defer span.End()
	if span.IsRecording() {
		t.Error("without an endpoint spans are recorded")
	}
	if h := telemetry.Inject(ctx, nil); h != nil {
		t.Errorf("an untraced message got headers %v", h)
	}
}

func TestInjectExtractRoundTrip(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "x", SpanProcessor: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	ctx, span := tel.Tracer("x").Start(context.Background(), "parent")
	orig := map[string]string{"k": "v"}
	h := telemetry.Inject(ctx, orig)
	span.End()
	if len(orig) != 1 {
		t.Error("Inject changed the caller's header map")
	}
	if h["k"] != "v" || !strings.HasPrefix(h["traceparent"], "00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("headers %v", h)
	}
	_, child := tel.Tracer("x").Start(telemetry.Extract(context.Background(), h), "child")
	child.End()
	if child.SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Error("the extracted context did not continue the trace")
	}
}

// TestOTLPExport points OTEL_EXPORTER_OTLP_ENDPOINT at a loopback HTTP
// server and checks that spans and metrics arrive there as OTLP.
func TestOTLPExport(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		if r.Method == http.MethodPost && r.Header.Get("Content-Type") == "application/x-protobuf" && len(body) > 0 {
			got[r.URL.Path]++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv(telemetry.EnvEndpoint, srv.URL)

	cfg := telemetry.FromEnv("hermes-test")
	if cfg.Endpoint != srv.URL {
		t.Fatalf("FromEnv endpoint %q", cfg.Endpoint)
	}
	tel, err := telemetry.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.Tracer("x").Start(context.Background(), "exported")
	if !span.IsRecording() {
		t.Error("with an endpoint spans are not recorded")
	}
	span.End()
	tel.Metrics().NATSConnected()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got["/v1/traces"] == 0 || got["/v1/metrics"] == 0 {
		t.Errorf("OTLP requests received: %v; want POST /v1/traces and /v1/metrics", got)
	}
}

// TestLogHandlerAddsTraceIDs: a record made with the context of a span
// carries its trace_id and span_id, also through a logger With attributes;
// one made without a span (or with the context of none) carries neither.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "x", SpanProcessor: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	var buf bytes.Buffer
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	ctx, span := tel.Tracer("x").Start(context.Background(), "work")
	log.InfoContext(ctx, "inside")
	span.End()
	log.InfoContext(context.Background(), "outside")
	log.Info("no context")

	var lines []map[string]any
	for line := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", len(lines), buf.String())
	}
	sc := span.SpanContext()
	if lines[0]["trace_id"] != sc.TraceID().String() || lines[0]["span_id"] != sc.SpanID().String() || lines[0]["component"] != "test" {
		t.Errorf("the line made inside the span: %v; want trace_id %s, span_id %s and component", lines[0], sc.TraceID(), sc.SpanID())
	}
	for _, m := range lines[1:] {
		if _, ok := m["trace_id"]; ok {
			t.Errorf("a line made outside any span carries a trace id: %v", m)
		}
		if _, ok := m["span_id"]; ok {
			t.Errorf("a line made outside any span carries a span id: %v", m)
		}
	}
}
