package dispatch

import (
	"context"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestOutboxMetricsSeries: the outbox's and the push notifications'
// counters exist at 0 from the start, under the names a router served
// them by, and count what they are given.
func TestOutboxMetricsSeries(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	m := newOutboxMetrics(tel.Meter())
	scrape := func() string { return testsvc.MetricsText(t, tel.Handler()) }
	fresh := scrape()
	for _, want := range []string{"hermes_outbox_queued_total 0", "hermes_push_sent_total 0", "hermes_push_failed_total 0",
		"hermes_push_dropped_total 0", `hermes_push_forgotten_total{kind="fcm"} 0`, `hermes_push_forgotten_total{kind="apns"} 0`} {
		if !strings.Contains(fresh, want) {
			t.Errorf("a fresh outbox's /metrics lacks %q", want)
		}
	}
	m.queued()
	m.PushSent()
	m.PushFailed()
	m.PushDropped()
	m.PushForgotten("apns")
	body := scrape()
	for _, want := range []string{"hermes_outbox_queued_total 1", "hermes_push_sent_total 1", "hermes_push_failed_total 1",
		"hermes_push_dropped_total 1", `hermes_push_forgotten_total{kind="apns"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
