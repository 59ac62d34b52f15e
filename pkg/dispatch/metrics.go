package dispatch

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// outboxMetrics are the Outbox's instruments; every counter series exists
// at 0 from the start. docs/metrics.md lists the names (a router's: an
// edge-only process keeps its deliver frames without them).
type outboxMetrics struct {
	outboxIn                          metric.Int64Counter
	pushSent, pushFailed, pushDropped metric.Int64Counter
	pushForgotten                     metric.Int64Counter
	byPushKind                        telemetry.LabelSet // fcm, apns
}

var bg = context.Background()

// newOutboxMetrics creates the Outbox's instruments on m. The names are
// constants, so an error is a bug, and it panics.
func newOutboxMetrics(m metric.Meter) *outboxMetrics {
	var x outboxMetrics
	var in telemetry.Instruments
	var e error
	x.outboxIn, e = m.Int64Counter("hermes_outbox_queued",
		metric.WithDescription("Agent outputs kept in an offline device's outbox."))
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
		panic(fmt.Sprintf("dispatch: creating the outbox's instruments: %v", err))
	}
	x.pushSent.Add(bg, 0)
	x.pushFailed.Add(bg, 0)
	x.pushDropped.Add(bg, 0)
	x.byPushKind = telemetry.NewLabelSet("kind", push.KindFCM, push.KindAPNs)
	for _, opts := range x.byPushKind.Known() {
		x.pushForgotten.Add(bg, 0, opts...)
	}
	x.outboxIn.Add(bg, 0)
	return &x
}

// queued counts an output kept for an offline device.
func (m *outboxMetrics) queued() { m.outboxIn.Add(bg, 1) }

// PushSent, PushFailed and PushDropped count push notifications
// (push.Metrics).
func (m *outboxMetrics) PushSent()    { m.pushSent.Add(bg, 1) }
func (m *outboxMetrics) PushFailed()  { m.pushFailed.Add(bg, 1) }
func (m *outboxMetrics) PushDropped() { m.pushDropped.Add(bg, 1) }

// PushForgotten counts a registration of kind forgotten for a dead token
// (push.Metrics).
func (m *outboxMetrics) PushForgotten(kind string) {
	m.pushForgotten.Add(bg, 1, m.byPushKind.Of(kind)...)
}
