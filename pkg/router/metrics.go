package router

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// metrics are the router's instruments; every counter series exists at 0
// from the start. docs/metrics.md lists the names.
type metrics struct {
	latency  metric.Float64Histogram
	dropped  metric.Int64Counter
	backlog  metric.Int64UpDownCounter
	takeover metric.Int64Counter
}

// latencyBuckets (seconds) cover a loopback write (sub-millisecond) up to
// the 15 s a delivery may take.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15}

var bg = context.Background()

// newMetrics creates the router's instruments on m. The names are
// constants, so an error is a bug, and it panics.
func newMetrics(m metric.Meter) *metrics {
	var x metrics
	var in telemetry.Instruments
	var e error
	x.latency, e = m.Float64Histogram("hermes_delivery_latency", metric.WithUnit("s"),
		metric.WithDescription("From the router sending an output to the owning edge acknowledging its write to the socket."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	in.Check(e)
	x.dropped, e = m.Int64Counter("hermes_journal_dropped",
		metric.WithDescription("Device events dropped unhandled after their routers died on them MaxAttempts times."))
	in.Check(e)
	x.backlog, e = m.Int64UpDownCounter("hermes_journal_backlog",
		metric.WithDescription("Device journals this router works now: each holds events queued for the agent or in its hands."))
	in.Check(e)
	x.takeover, e = m.Int64Counter("hermes_journal_takeovers",
		metric.WithDescription("Device journals this router took over from another router's lease (expired: its router died or was cut off; or released at shutdown)."))
	in.Check(e)
	if err := in.Err(); err != nil {
		panic(fmt.Sprintf("router: creating the instruments: %v", err))
	}
	x.dropped.Add(bg, 0)
	x.backlog.Add(bg, 0)
	x.takeover.Add(bg, 0)
	return &x
}

// journalWorked counts a device journal this router begins (+1) or stops
// (-1) working.
func (m *metrics) journalWorked(delta int64) { m.backlog.Add(bg, delta) }

// journalsTakenOver counts n journals taken over from other routers.
func (m *metrics) journalsTakenOver(n int) {
	if n > 0 {
		m.takeover.Add(bg, int64(n))
	}
}

// deliveryLatency records how long an acknowledged delivery took.
func (m *metrics) deliveryLatency(d time.Duration) { m.latency.Record(bg, d.Seconds()) }

// journalDropped counts a device event given up on after its routers died
// on it too often.
func (m *metrics) journalDropped() { m.dropped.Add(bg, 1) }
