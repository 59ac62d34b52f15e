package router

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// metrics are the router's instruments; every counter series exists at 0
// from the start. docs/metrics.md lists the names.
type metrics struct {
	outboxIn metric.Int64Counter
	latency  metric.Float64Histogram
	dropped  metric.Int64Counter
	backlog  metric.Int64UpDownCounter
	takeover metric.Int64Counter

	pushSent, pushFailed, pushDropped metric.Int64Counter
	pushForgotten                     metric.Int64Counter
	byPushKind                        telemetry.LabelSet // fcm, apns
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
	x.outboxIn, e = m.Int64Counter("hermes_outbox_queued",
		metric.WithDescription("Agent outputs kept in an offline device's outbox."))
	in.Check(e)
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
	x.pushSent, e = m.Int64Counter("hermes_push_sent",
		metric.WithDescription("Push notifications a device's push endpoint accepted."))
	in.Check(e)
	x.pushFailed, e = m.Int64Counter("hermes_push_failed",
		metric.WithDescription("Push notifications given up on: every attempt failed, the endpoint refused, or its registration could not be read."))
	in.Check(e)
	x.pushDropped, e = m.Int64Counter("hermes_push_dropped",
		metric.WithDescription("Push notifications dropped unsent because the push queue was full, or a push service's share of it."))
	in.Check(e)
	x.pushForgotten, e = m.Int64Counter("hermes_push_forgotten",
		metric.WithDescription("Push registrations forgotten because their service (FCM, APNs) reported the token no longer valid, by kind."))
	in.Check(e)
	if err := in.Err(); err != nil {
		panic(fmt.Sprintf("router: creating the instruments: %v", err))
	}
	x.pushSent.Add(bg, 0)
	x.pushFailed.Add(bg, 0)
	x.pushDropped.Add(bg, 0)
	x.byPushKind = telemetry.NewLabelSet("kind", push.KindFCM, push.KindAPNs)
	for _, opts := range x.byPushKind.Known() {
		x.pushForgotten.Add(bg, 0, opts...)
	}
	x.outboxIn.Add(bg, 0)
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

// outboxQueued counts an output kept for an offline device.
func (m *metrics) outboxQueued() { m.outboxIn.Add(bg, 1) }

// deliveryLatency records how long an acknowledged delivery took.
func (m *metrics) deliveryLatency(d time.Duration) { m.latency.Record(bg, d.Seconds()) }

// journalDropped counts a device event given up on after its routers died
// on it too often.
func (m *metrics) journalDropped() { m.dropped.Add(bg, 1) }

// PushSent, PushFailed and PushDropped count push notifications
// (push.Metrics).
func (m *metrics) PushSent()    { m.pushSent.Add(bg, 1) }
func (m *metrics) PushFailed()  { m.pushFailed.Add(bg, 1) }
func (m *metrics) PushDropped() { m.pushDropped.Add(bg, 1) }

// PushForgotten counts a registration of kind forgotten for a dead token
// (push.Metrics).
func (m *metrics) PushForgotten(kind string) { m.pushForgotten.Add(bg, 1, m.byPushKind.Of(kind)...) }
