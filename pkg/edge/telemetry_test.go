package edge

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestFrameOutReadsTheType counts frames of every header size (7-bit,
// 16-bit and 64-bit lengths) by the type in their payload, without
// allocating.
func TestFrameOutReadsTheType(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	et := newEdgeTelemetry(tel)

	small := textFrame(protocol.AppendPong(newFrame(32), nil))
	medium := textFrame(protocol.AppendMessage(newFrame(2000), protocol.Message{ID: "m", Text: strings.Repeat("a", 1000), Total: 1}))
	large := textFrame(protocol.AppendMessage(newFrame(70000), protocol.Message{ID: "m", Text: strings.Repeat("a", 70000), Total: 1}))
	if medium[1]&0x7f != 126 || large[1]&0x7f != 127 {
		t.Fatalf("length codes %d, %d: the frames do not cover the 16- and 64-bit headers", medium[1]&0x7f, large[1]&0x7f)
	}
	for _, f := range [][]byte{small, medium, large, closeFrame(1000, "bye"), nil} {
		et.frameOut(f)
	}
	if n := testing.AllocsPerRun(100, func() { et.frameOut(medium) }); n != 0 {
		t.Errorf("frameOut allocates %v times per frame", n)
	}

	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	// Messages: medium and large, then AllocsPerRun's warm-up and 100 runs.
	for _, want := range []string{`hermes_frames_out_total{type="pong"} 1`, `hermes_frames_out_total{type="message"} 103`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(string(body), `hermes_frames_out_total{type="other"} 0`) {
		t.Error("a close frame or an empty marker was counted")
	}
}

// TestMetricsSeries: the edge's series exist at 0 from the start, count
// what they are given, and a label value outside the fixed lists is counted
// as other instead of becoming a series.
func TestMetricsSeries(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newMetrics(tel.Meter())
	scrape := func() string {
		rec := httptest.NewRecorder()
		tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	fresh := scrape()
	for _, want := range []string{
		"hermes_connections 0", `hermes_handshakes_total{result="ok"} 0`, `hermes_frames_in_total{type="other"} 0`,
		`hermes_closes_total{by="peer",code="1006"} 0`, `hermes_slow_reader_closes_total{reason="queue_full"} 0`,
		"hermes_outbox_delivered_total 0", "hermes_deliveries_unacked_total 0",
	} {
		if !strings.Contains(fresh, want) {
			t.Errorf("a fresh edge's /metrics lacks %q", want)
		}
	}
	m.connOpened()
	m.handshake(handshakeOK)
	m.handshake(string(protocol.CodeAuthFailed))
	m.frameIn(protocol.TypeText)
	m.frameIn("no-such-type")
	m.error(string(protocol.CodeTooBig))
	m.dedupHit()
	m.upload(10)
	m.outboxDelivered(2)
	m.slowReaderClosed(slowReaderStalled)
	m.connClosed(4000, true, 0)
	body := scrape()
	for _, want := range []string{
		`hermes_connections 0`,
		`hermes_handshakes_total{result="ok"} 1`,
		`hermes_handshakes_total{result="auth_failed"} 1`,
		`hermes_frames_in_total{type="text"} 1`,
		`hermes_frames_in_total{type="other"} 1`,
		`hermes_errors_total{code="too_big"} 1`,
		"hermes_dedup_hits_total 1",
		"hermes_upload_bytes_total 10",
		"hermes_outbox_delivered_total 2",
		`hermes_slow_reader_closes_total{reason="write_stalled"} 1`,
		`hermes_closes_total{by="peer",code="other"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "no-such-type") {
		t.Error("a client-chosen frame type became a label value")
	}
	if strings.Contains(body, "hermes_journal_dropped_total") || strings.Contains(body, "hermes_outbox_queued_total") {
		t.Error("an edge serves the router's series")
	}
}

// TestMetricsAllocateNothing: the calls made per frame cost no allocation.
func TestMetricsAllocateNothing(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newMetrics(tel.Meter())
	typ := []byte("message")
	for name, f := range map[string]func(){
		"frameIn":        func() { m.frameIn(protocol.TypeText) },
		"frameIn(other)": func() { m.frameIn("made-up") },
		"frameOutBytes":  func() { m.frameOutBytes(typ) },
		"error":          func() { m.error(string(protocol.CodeBadFrame)) },
		"handshake":      func() { m.handshake(handshakeOK) },
		"helloReady":     func() { m.helloReady(time.Millisecond) },
		"dedupHit":       func() { m.dedupHit() },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
	}
}

// TestBudgetMetrics: each edge-wide budget's use, limit and refusals are
// served by budget from the start, follow takes and releases, and stop
// being served once the reporting stops.
func TestBudgetMetrics(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newMetrics(tel.Meter())
	reading, queued, uploading, hello := &budget{limit: 100}, &budget{limit: 200}, &budget{limit: 300}, &budget{limit: 400}
	stop := m.observeBudgets([len(budgetNames)]*budget{reading, queued, uploading, hello})
	scrape := func() string {
		rec := httptest.NewRecorder()
		tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	want := func(body string, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if !strings.Contains(body, l+"\n") {
				t.Errorf("/metrics lacks %q", l)
			}
		}
	}
	want(scrape(),
		`hermes_budget_used_bytes{budget="read"} 0`, `hermes_budget_used_bytes{budget="queued"} 0`, `hermes_budget_used_bytes{budget="upload"} 0`,
		`hermes_budget_limit_bytes{budget="read"} 100`, `hermes_budget_limit_bytes{budget="queued"} 200`, `hermes_budget_limit_bytes{budget="upload"} 300`,
		`hermes_budget_exhausted_total{budget="read"} 0`, `hermes_budget_exhausted_total{budget="queued"} 0`, `hermes_budget_exhausted_total{budget="upload"} 0`,
		`hermes_budget_used_bytes{budget="hello"} 0`, `hermes_budget_limit_bytes{budget="hello"} 400`, `hermes_budget_exhausted_total{budget="hello"} 0`)

	if !reading.take(100) { // exactly the limit fits
		t.Fatal("a take of exactly the limit was refused")
	}
	if reading.take(1) {
		t.Fatal("a take past the limit fit")
	}
	queued.force(250)
	uploading.take(30)
	uploading.release(10)
	hello.take(7)
	want(scrape(),
		`hermes_budget_used_bytes{budget="hello"} 7`,
		`hermes_budget_used_bytes{budget="read"} 100`, `hermes_budget_used_bytes{budget="queued"} 250`, `hermes_budget_used_bytes{budget="upload"} 20`,
		`hermes_budget_exhausted_total{budget="read"} 1`, `hermes_budget_exhausted_total{budget="queued"} 0`)

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(scrape(), "hermes_budget_used_bytes{") {
		t.Error("the budgets are still reported after stop")
	}
}

// TestHandshakeDuration: a hello that got ready counts as ok and is timed.
func TestHandshakeDuration(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newMetrics(tel.Meter())
	m.helloReady(30 * time.Millisecond)
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`hermes_handshakes_total{result="ok"} 1`,
		"hermes_handshake_duration_seconds_count 1",
		`hermes_handshake_duration_seconds_bucket{le="0.025"} 0`,
		`hermes_handshake_duration_seconds_bucket{le="0.05"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
