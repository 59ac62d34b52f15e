package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

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

// otlpReceiver is a loopback OTLP/HTTP collector counting the POSTs it
// gets by path.
type otlpReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string]int
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{got: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		if req.Method == http.MethodPost && len(body) > 0 {
			r.got[req.URL.Path]++
		}
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.got)
}

// exportOnce records a span and a metric on a Telemetry made from the
// environment and shuts it down, which flushes both.
func exportOnce(t *testing.T) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.FromEnv("hermes-test"))
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.Tracer("x").Start(context.Background(), "exported")
	span.End()
	tel.Metrics().NATSConnected()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOTLPSignalEndpoints: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT are used as they are, and win over
// OTEL_EXPORTER_OTLP_ENDPOINT, which gets nothing; one signal's endpoint
// alone exports that signal alone.
func TestOTLPSignalEndpoints(t *testing.T) {
	base, traces, metrics := newOTLPReceiver(t), newOTLPReceiver(t), newOTLPReceiver(t)
	t.Setenv(telemetry.EnvEndpoint, base.URL)
	t.Setenv(telemetry.EnvTracesEndpoint, traces.URL+"/custom/spans")
	t.Setenv(telemetry.EnvMetricsEndpoint, metrics.URL+"/custom/points")
	exportOnce(t)
	if got := base.counts(); len(got) != 0 {
		t.Errorf("the base endpoint got %v; the signals' own endpoints should win", got)
	}
	if got := traces.counts(); got["/custom/spans"] == 0 || len(got) != 1 {
		t.Errorf("the traces endpoint got %v, want POSTs to /custom/spans only", got)
	}
	if got := metrics.counts(); got["/custom/points"] == 0 || len(got) != 1 {
		t.Errorf("the metrics endpoint got %v, want POSTs to /custom/points only", got)
	}

	only := newOTLPReceiver(t)
	t.Setenv(telemetry.EnvEndpoint, "")
	t.Setenv(telemetry.EnvTracesEndpoint, only.URL+"/v1/traces")
	t.Setenv(telemetry.EnvMetricsEndpoint, "")
	exportOnce(t)
	if got := only.counts(); got["/v1/traces"] == 0 || len(got) != 1 {
		t.Errorf("with only a traces endpoint it got %v, want traces only", got)
	}
}

// TestOTLPProtocol: OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports spans and
// metrics to a loopback OTLP/gRPC collector at OTEL_EXPORTER_OTLP_ENDPOINT;
// a protocol the gateway does not speak is an error naming its variable.
func TestOTLPProtocol(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &grpcCollector{}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, traceService{c: col})
	colmetrics.RegisterMetricsServiceServer(srv, metricsService{c: col})
	go srv.Serve(ln)
	defer srv.Stop()

	t.Setenv(telemetry.EnvProtocol, "grpc")
	t.Setenv(telemetry.EnvEndpoint, "http://"+ln.Addr().String())
	exportOnce(t)
	if spans, points := col.spans.Load(), col.metrics.Load(); spans == 0 || points == 0 {
		t.Errorf("the gRPC collector got %d trace and %d metric exports, want both", spans, points)
	}

	t.Setenv(telemetry.EnvProtocol, "")
	t.Setenv(telemetry.EnvMetricsProtocol, "http/json")
	if _, err := telemetry.New(context.Background(), telemetry.FromEnv("x")); err == nil || !strings.Contains(err.Error(), telemetry.EnvMetricsProtocol) {
		t.Errorf("an unknown metrics protocol: %v, want an error naming %s", err, telemetry.EnvMetricsProtocol)
	}
}

// grpcCollector counts the OTLP/gRPC exports it gets.
type grpcCollector struct{ spans, metrics atomic.Int32 }

type traceService struct {
	coltrace.UnimplementedTraceServiceServer
	c *grpcCollector
}

func (s traceService) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	if len(req.GetResourceSpans()) > 0 {
		s.c.spans.Add(1)
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetrics.UnimplementedMetricsServiceServer
	c *grpcCollector
}

func (s metricsService) Export(_ context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	if len(req.GetResourceMetrics()) > 0 {
		s.c.metrics.Add(1)
	}
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

// TestRedisCommandAllocatesNothing: timing a Redis command, done on every
// command, costs no allocation.
func TestRedisCommandAllocatesNothing(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := tel.Metrics()
	if n := testing.AllocsPerRun(100, func() { m.RedisCommand(time.Millisecond) }); n != 0 {
		t.Errorf("RedisCommand allocates %v times per call", n)
	}
}

// TestVersionLine: what -version prints names the command, the version and
// the Go toolchain, and says "unknown" rather than nothing without a VCS
// revision (a test binary has none).
func TestVersionLine(t *testing.T) {
	got := telemetry.VersionLine("edge")
	for _, want := range []string{"edge " + telemetry.Version + " ", " revision ", " " + runtime.Version()} {
		if !strings.Contains(got, want) {
			t.Errorf("VersionLine = %q, want it to contain %q", got, want)
		}
	}
}
