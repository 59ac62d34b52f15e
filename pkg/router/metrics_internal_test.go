package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestMetricsSeries: the router's counters exist at 0 from the start and
// count what they are given; a delivery's latency lands in its bucket
// without an allocation.
func TestMetricsSeries(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newMetrics(tel.Meter())
	scrape := func() string { return testsvc.MetricsText(t, tel.Handler()) }
	fresh := scrape()
	for _, want := range []string{"hermes_journal_dropped_total 0",
		"hermes_journal_backlog 0", "hermes_journal_takeovers_total 0"} {
		if !strings.Contains(fresh, want) {
			t.Errorf("a fresh router's /metrics lacks %q", want)
		}
	}
	m.journalDropped()
	m.journalWorked(1)
	m.journalWorked(1)
	m.journalWorked(-1)
	m.journalsTakenOver(3)
	m.journalsTakenOver(0)
	m.deliveryLatency(3 * time.Millisecond)
	if n := testing.AllocsPerRun(100, func() { m.deliveryLatency(time.Second) }); n != 0 {
		t.Errorf("deliveryLatency allocates %v times per call", n)
	}
	body := scrape()
	for _, want := range []string{
		"hermes_journal_dropped_total 1",
		"hermes_journal_backlog 1",
		"hermes_journal_takeovers_total 3",
		"hermes_delivery_latency_seconds_count 102",
		`hermes_delivery_latency_seconds_bucket{le="0.0025"} 0`,
		`hermes_delivery_latency_seconds_bucket{le="0.005"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "hermes_frames_in_total") {
		t.Error("a router serves the edge's series")
	}
}
