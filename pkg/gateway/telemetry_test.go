package gateway_test

// Telemetry seen from outside: /metrics scraped over HTTP while a phone
// talks to the node over a real socket, one trace across the bus, and logs
// that never show a token.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

func newTelemetry(t *testing.T, cfg telemetry.Config) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	return tel
}

func TestMetricsOverRealSockets(t *testing.T) {
	tel := newTelemetry(t, telemetry.Config{ServiceName: "hermes-edge"})
	n := startNode(t, func(c *gateway.Config) { c.Telemetry = tel })
	srv := httptest.NewServer(tel.Handler())
	defer srv.Close()
	url := srv.URL + "/metrics"
	ctx := testCtx(t)

	// A refused hello.
	bad := n.dial(t)
	if _, err := bad.Hello(ctx, "wrong-token", protocol.Device{ID: "tel-bad"}, protocol.User{}); err == nil {
		t.Fatal("a wrong token was accepted")
	}
	// A conversation: one answer, one resend of the same id (a duplicate),
	// one empty text (bad_frame) and a frame of a type the gateway ignores.
	c, _ := n.connect(t, "tel-metrics")
	if err := c.Text("m1", "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := collectAnswer(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("m1", "hello"); err != nil {
		t.Fatal(err)
	}
	if err := c.SendRaw([]byte(`{"t":"text","id":"m2","text":""}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Expect(ctx, protocol.TypeError); err != nil {
		t.Fatal(err)
	}
	if err := c.SendRaw([]byte(`{"t":"x-custom"}`)); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitMetric(t, 10*time.Second, url, "hermes_dedup_hits_total", testsvc.AtLeast(1))
	m := testsvc.WaitMetric(t, 10*time.Second, url, `hermes_frames_in_total{type="unknown"}`, testsvc.AtLeast(1))

	for sample, want := range map[string]float64{
		`hermes_handshakes_total{result="ok"}`:          1,
		`hermes_handshakes_total{result="auth_failed"}`: 1,
		`hermes_frames_in_total{type="hello"}`:          2,
		`hermes_frames_in_total{type="text"}`:           2,
		`hermes_frames_in_total{type="invalid"}`:        1, // the empty text fails validation
		`hermes_frames_in_total{type="unknown"}`:        1,
		`hermes_frames_out_total{type="ready"}`:         1,
		`hermes_frames_out_total{type="message"}`:       3, // the demo streams: message, two edits
		`hermes_frames_out_total{type="avatar"}`:        1,
		`hermes_frames_out_total{type="error"}`:         2, // auth_failed, bad_frame
		`hermes_errors_total{code="bad_frame"}`:         1,
		`hermes_errors_total{code="auth_failed"}`:       1,
		"hermes_dedup_hits_total":                       1,
		"hermes_delivery_latency_seconds_count":         3,
		"hermes_connections":                            1,
	} {
		if got, ok := m[sample]; !ok || got < want || strings.HasPrefix(sample, "hermes_handshakes") && got != want {
			t.Errorf("%s = %v (present %v), want %v", sample, got, ok, want)
		}
	}
	if m["go_goroutines"] <= 0 || m["process_resident_memory_bytes"] <= 0 {
		t.Errorf("runtime metrics missing: go_goroutines=%v process_resident_memory_bytes=%v",
			m["go_goroutines"], m["process_resident_memory_bytes"])
	}
	for sample := range m {
		if strings.Contains(sample, "x-custom") {
			t.Errorf("a client-chosen type became a label: %s", sample)
		}
	}

	// The refused socket is gone; closing the good one brings the gauge to 0.
	c.Close()
	testsvc.WaitMetric(t, 5*time.Second, url, "hermes_connections", testsvc.Equals(0))
}

// TestTraceCrossesTheBus follows one text from the edge through NATS to
// the router, the agent and back to the edge's socket write: every span
// shares the edge's trace id, and each hop's parent is the hop before it.
func TestTraceCrossesTheBus(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel := newTelemetry(t, telemetry.Config{ServiceName: "hermes-edge", SpanProcessor: rec})
	n := startNode(t, func(c *gateway.Config) { c.Telemetry = tel })
	ctx := testCtx(t)
	c, _ := n.connect(t, "tel-trace")
	const secret = "private words of the user"
	if err := c.Text("t1", secret); err != nil {
		t.Fatal(err)
	}
	if _, err := collectAnswer(ctx, c); err != nil {
		t.Fatal(err)
	}

	names := []string{"edge.event", "router.event", "agent.handle", "router.deliver", "edge.deliver"}
	var spans map[string]sdktrace.ReadOnlySpan
	if !testsvc.Eventually(10*time.Second, func() bool {
		spans = make(map[string]sdktrace.ReadOnlySpan)
		for _, s := range rec.Ended() {
			if _, seen := spans[s.Name()]; !seen {
				spans[s.Name()] = s // the first of each: the first delivery
			}
		}
		return len(spans) >= len(names)
	}) {
		t.Fatalf("ended spans %v, want all of %v", keys(spans), names)
	}
	root := spans["edge.event"]
	for i, name := range names {
		s := spans[name]
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s is in trace %s, the edge's event in %s", name, s.SpanContext().TraceID(), root.SpanContext().TraceID())
		}
		if i > 0 && s.Parent().SpanID() != spans[names[i-1]].SpanContext().SpanID() {
			t.Errorf("%s's parent is not %s", name, names[i-1])
		}
		if s.Parent().IsRemote() != (name == "router.event" || name == "edge.deliver") {
			t.Errorf("%s: remote parent %v; only the hops across NATS have one", name, s.Parent().IsRemote())
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), secret) {
				t.Errorf("%s carries the text of the frame in %s", name, a.Key)
			}
		}
	}
}

// collectAnswer reads the agent's next message to its final edit.
func collectAnswer(ctx context.Context, c *client.Conn) (string, error) {
	first, err := c.Expect(ctx, protocol.TypeMessage)
	if err != nil {
		return "", err
	}
	text, _, err := c.CollectMessage(ctx, first.Str("id"))
	return text, err
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestLogsNeverShowTokens runs refused and accepted hellos with every kind
// of token configured, at debug level, and searches the JSON logs for them.
func TestLogsNeverShowTokens(t *testing.T) {
	const (
		appToken     = "app-token-3f9a1c"
		boundToken   = "bound-token-7d2e4b"
		deliverToken = "deliver-token-91c0aa"
		wrongToken   = "wrong-token-5be812"
	)
	logs := testsvc.NewBuffer()
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testsvc.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := gateway.Config{
		Listen: "127.0.0.1:0", Router: true,
		Edge: edge.Config{Auth: edge.AuthConfig{
			Token:         appToken,
			ExtraTokens:   map[string]secret.Secret{"tel-bound": boundToken},
			DeliverTokens: []secret.Secret{deliverToken},
		}},
	}
	g, err := gateway.Start(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{Gateway: g}
	ctx := testCtx(t)
	hello := func(token, device string) error {
		c := n.dial(t)
		defer c.CloseNow()
		_, err := c.Hello(ctx, token, protocol.Device{ID: device}, protocol.User{ID: "u"})
		if err == nil {
			if err := c.Text("x", "hi"); err != nil {
				return err
			}
			_, err = collectAnswer(ctx, c)
		}
		return err
	}
	for _, tc := range []struct {
		token, device string
		ok            bool
	}{
		{wrongToken, "tel-1", false},
		{boundToken, "tel-other", false}, // a bound token for another device
		{appToken, "tel-bound", false},   // a bound device with another token
		{appToken, "tel-1", true},
		{boundToken, "tel-bound", true},
		{deliverToken, "cron", true},
	} {
		if err := hello(tc.token, tc.device); (err == nil) != tc.ok {
			t.Errorf("hello as %s: err %v, want ok=%v", tc.device, err, tc.ok)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, `"code":"auth_failed"`) || !strings.Contains(out, `"code":"forbidden"`) {
		t.Fatalf("the refusals were not logged; the test would prove nothing:\n%s", out)
	}
	for _, tok := range []string{appToken, boundToken, deliverToken, wrongToken} {
		if strings.Contains(out, tok) {
			t.Errorf("the logs contain the token %q", tok)
		}
	}
}

// TestEventCarriesTraceParent: with tracing on, the event an edge hands to
// the routers names its trace in the event itself (wire.Event.TraceParent,
// the event log's `traceparent`), the same context as the bus header and
// the edge's span; with tracing off it carries none.
func TestEventCarriesTraceParent(t *testing.T) {
	for _, tracing := range []bool{true, false} {
		t.Run(fmt.Sprintf("tracing=%v", tracing), func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			cfg := telemetry.Config{ServiceName: "hermes-edge"}
			if tracing {
				cfg.SpanProcessor = rec
			}
			tel := newTelemetry(t, cfg)
			n := startNode(t, func(c *gateway.Config) { c.Telemetry = tel; c.Router = false })
			got := make(chan *bus.Msg, 1)
			sub, err := n.Bus.QueueSubscribe(bus.InboundSubject, bus.QueueRouters, func(m *bus.Msg) {
				select {
				case got <- m:
				default:
				}
				m.Respond([]byte(`{"ok":true}`))
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			c, _ := n.connect(t, "tel-traceparent")
			if err := c.Text("tp-1", "hello"); err != nil {
				t.Fatal(err)
			}
			var m *bus.Msg
			select {
			case m = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the event did not reach the bus")
			}
			var ev wire.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatal(err)
			}
			if !tracing {
				if ev.TraceParent != "" || m.Header["traceparent"] != "" {
					t.Fatalf("untraced event carries traceparent %q (header %q)", ev.TraceParent, m.Header["traceparent"])
				}
				return
			}
			if ev.TraceParent == "" || ev.TraceParent != m.Header["traceparent"] {
				t.Fatalf("event traceparent %q, bus header %q: want the same, not empty", ev.TraceParent, m.Header["traceparent"])
			}
			var span sdktrace.ReadOnlySpan
			testsvc.WaitFor(t, 10*time.Second, "an edge.event span to end", func() bool {
				for _, s := range rec.Ended() {
					if s.Name() == "edge.event" {
						span = s
					}
				}
				return span != nil
			})
			want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-"
			if !strings.HasPrefix(ev.TraceParent, want) {
				t.Fatalf("event traceparent %q, want the edge.event span's %q…", ev.TraceParent, want)
			}
		})
	}
}
