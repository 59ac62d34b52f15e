package edge

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// metrics are the edge's instruments. Every method allocates nothing:
// attribute sets are built up front for every frame type, error code and
// close code, and a value outside those sets is counted under "other", so a
// client cannot grow the number of series. Every counter series exists at
// 0 from the start, so increase() and alerts see the first event.
// docs/metrics.md lists the names.
type metrics struct {
	conns        metric.Int64UpDownCounter
	handshakes   metric.Int64Counter
	framesIn     metric.Int64Counter
	framesOut    metric.Int64Counter
	errors       metric.Int64Counter
	dedupHits    metric.Int64Counter
	uploadBytes  metric.Int64Counter
	outboxOut    metric.Int64Counter
	moved        metric.Int64Counter
	unacked      metric.Int64Counter
	closes       metric.Int64Counter
	connDuration metric.Float64Histogram
	draining     metric.Int64UpDownCounter
	slowReaders  metric.Int64Counter
	acceptFails  metric.Int64Counter
	evictions    metric.Int64Counter
	helloTime    metric.Float64Histogram
	budgetUsed   metric.Int64ObservableGauge
	budgetLimit  metric.Int64ObservableGauge
	budgetFull   metric.Int64ObservableCounter

	byType   telemetry.LabelSet // frame type → {type=…}
	byCode   telemetry.LabelSet // error code → {code=…}
	byResult telemetry.LabelSet // "ok" or an error code → {result=…}
	byReason telemetry.LabelSet // slowReaderQueueFull, slowReaderStalled → {reason=…}
	byStage  telemetry.LabelSet // acceptStageAccept, acceptStageUpgrade, acceptStageHello → {stage=…}
	// budgetOpts are the options of {budget=read|queued|upload|hello}, in
	// the order of budgetNames.
	budgetOpts [len(budgetNames)]metric.ObserveOption
	meter      metric.Meter
	// closeOpts[i][by] are the options of closeCodes[i] (the last one
	// "other") closed by the edge (by 0) or the peer (by 1).
	closeOpts [][2][]metric.AddOption
}

// frameTypes are the type label values: every Protocol v1 frame type, plus
// "unknown" (a well-formed frame of a type the gateway ignores) and
// "invalid" (a frame that failed decoding or validation).
var frameTypes = []string{
	protocol.TypeHello, protocol.TypeText, protocol.TypeAudio, protocol.TypeMedia, protocol.TypePrompt,
	protocol.TypeTyping, protocol.TypePing, protocol.TypeAck, protocol.TypeDeliver, protocol.TypeReady,
	protocol.TypeMessage, protocol.TypePromptDone, protocol.TypeAvatar, protocol.TypePong, protocol.TypeError,
	protocol.TypePush, frameUnknown, frameInvalid,
}

// Type label values for frames that have no Protocol v1 type.
const (
	frameUnknown = "unknown"
	frameInvalid = "invalid"
)

var errorCodes = []string{
	string(protocol.CodeBadFrame), string(protocol.CodeAuthFailed), string(protocol.CodeForbidden),
	string(protocol.CodeUnsupportedFrame), string(protocol.CodeTooBig), string(protocol.CodeDeviceOffline),
	string(protocol.CodeAuthRequired), string(protocol.CodeInternalError),
}

// handshakeOK is the result label of a hello that ended in ready; a refused
// hello is labelled with the error code it got.
const handshakeOK = "ok"

// Reasons a slow reader is cut (the reason label).
const (
	slowReaderQueueFull = "queue_full"    // MaxOutboundBytes queued unwritten, or the edge-wide MaxQueuedBytes passed
	slowReaderStalled   = "write_stalled" // no write progress for WriteTimeout
)

// Stages a connection can fail at before it is open (the stage label).
const (
	acceptStageAccept  = "accept"           // the listener's Accept failed (out of files, …)
	acceptStageUpgrade = "upgrade"          // the HTTP request was no valid WebSocket upgrade of /ws, or did not complete in time
	acceptStageHello   = "hello_phase_full" // refused (503): the hello phase had no place, and no stranger could give up its own
)

// closeCodes are the code label values (RFC 6455 7.4.1): the codes the
// edge sends (1000, 1001, 1002, 1007, 1008), those apps commonly send,
// 1005 (a close frame without a code) and 1006 (no close frame). Any other
// code counts as "other".
var closeCodes = []int{1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011}

// budgetNames are the budget label values: MOBILE_MAX_READ_MIB,
// MOBILE_MAX_QUEUED_MIB, MOBILE_MAX_UPLOAD_MIB and MOBILE_MAX_HELLO_MIB.
var budgetNames = [4]string{"read", "queued", "upload", "hello"}

// helloBuckets (seconds) run from a hello answered from memory to one
// whose store call ran into the 5 s operation timeout.
var helloBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15}

// connDurationBuckets (seconds) run from a refused hello to a phone that
// stays a day.
var connDurationBuckets = []float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400}

var bg = context.Background()

// newMetrics creates the edge's instruments on m. The names are constants,
// so an error is a bug, and it panics.
func newMetrics(m metric.Meter) *metrics {
	var x metrics
	var in telemetry.Instruments
	var e error
	x.conns, e = m.Int64UpDownCounter("hermes_connections",
		metric.WithDescription("Open WebSocket connections on this edge."))
	in.Check(e)
	x.handshakes, e = m.Int64Counter("hermes_handshakes",
		metric.WithDescription("Hellos answered, by result: ok or the error code of the refusal."))
	in.Check(e)
	x.framesIn, e = m.Int64Counter("hermes_frames_in",
		metric.WithDescription("WebSocket messages received from apps, by frame type."))
	in.Check(e)
	x.framesOut, e = m.Int64Counter("hermes_frames_out",
		metric.WithDescription("Frames queued for apps' sockets, by frame type."))
	in.Check(e)
	x.errors, e = m.Int64Counter("hermes_errors",
		metric.WithDescription("Error frames sent to apps, by error code."))
	in.Check(e)
	x.dedupHits, e = m.Int64Counter("hermes_dedup_hits",
		metric.WithDescription("Repeated text, audio and media ids dropped as duplicates."))
	in.Check(e)
	x.uploadBytes, e = m.Int64Counter("hermes_upload", metric.WithUnit("By"),
		metric.WithDescription("Bytes of multi-part media chunks taken into upload buffers."))
	in.Check(e)
	x.outboxOut, e = m.Int64Counter("hermes_outbox_delivered",
		metric.WithDescription("Outbox items written to a device after its ready."))
	in.Check(e)
	x.moved, e = m.Int64Counter("hermes_deliveries_moved",
		metric.WithDescription("Deliveries written to a socket whose device had a newer owner by then (an edge that was paused): answered moved, sent again to the owner."))
	in.Check(e)
	x.unacked, e = m.Int64Counter("hermes_deliveries_unacked",
		metric.WithDescription("Deliveries to a phone that acks which it did not ack in time or before its socket closed: kept for the outbox."))
	in.Check(e)
	x.closes, e = m.Int64Counter("hermes_closes",
		metric.WithDescription("WebSocket connections closed, by the close code that ended them and by whom the close began."))
	in.Check(e)
	x.connDuration, e = m.Float64Histogram("hermes_connection_duration", metric.WithUnit("s"),
		metric.WithDescription("How long WebSocket connections stayed open, from the upgrade to the socket closing."),
		metric.WithExplicitBucketBoundaries(connDurationBuckets...))
	in.Check(e)
	x.draining, e = m.Int64UpDownCounter("hermes_draining",
		metric.WithDescription("1 while this edge drains: it accepts no connections and closes its own one by one."))
	in.Check(e)
	x.slowReaders, e = m.Int64Counter("hermes_slow_reader_closes",
		metric.WithDescription("Connections cut because the app did not read: its outbound queue was full, or a write made no progress for WriteTimeout."))
	in.Check(e)
	x.acceptFails, e = m.Int64Counter("hermes_accept_failures",
		metric.WithDescription("Connections the edge could not take: the listener's accept failed, or the WebSocket upgrade did."))
	in.Check(e)
	x.evictions, e = m.Int64Counter("hermes_hello_evictions",
		metric.WithDescription("Sockets that had not said hello closed to give their place in the hello phase to a newcomer."))
	in.Check(e)
	x.helloTime, e = m.Float64Histogram("hermes_handshake_duration", metric.WithUnit("s"),
		metric.WithDescription("From a hello's arrival to its ready being queued, for hellos that got ready."),
		metric.WithExplicitBucketBoundaries(helloBuckets...))
	in.Check(e)
	x.budgetUsed, e = m.Int64ObservableGauge("hermes_budget_used", metric.WithUnit("By"),
		metric.WithDescription("Bytes an edge-wide budget holds now, by budget: read (large messages being read), queued (frames queued to phones), upload (unfinished uploads)."))
	in.Check(e)
	x.budgetLimit, e = m.Int64ObservableGauge("hermes_budget_limit", metric.WithUnit("By"),
		metric.WithDescription("The limit of each edge-wide budget (MOBILE_MAX_READ_MIB, MOBILE_MAX_QUEUED_MIB, MOBILE_MAX_UPLOAD_MIB)."))
	in.Check(e)
	x.budgetFull, e = m.Int64ObservableCounter("hermes_budget_exhausted",
		metric.WithDescription("Reservations an edge-wide budget refused because it was full, by budget."))
	in.Check(e)
	if err := in.Err(); err != nil {
		panic(fmt.Sprintf("edge: creating the instruments: %v", err))
	}
	x.meter = m
	for i, name := range budgetNames {
		x.budgetOpts[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("budget", name)))
	}
	x.byType = telemetry.NewLabelSet("type", frameTypes...)
	x.byCode = telemetry.NewLabelSet("code", errorCodes...)
	x.byResult = telemetry.NewLabelSet("result", append([]string{handshakeOK}, errorCodes...)...)
	x.byReason = telemetry.NewLabelSet("reason", slowReaderQueueFull, slowReaderStalled)
	x.byStage = telemetry.NewLabelSet("stage", acceptStageAccept, acceptStageUpgrade, acceptStageHello)
	x.closeOpts = make([][2][]metric.AddOption, len(closeCodes)+1)
	for i := range x.closeOpts {
		code := "other"
		if i < len(closeCodes) {
			code = strconv.Itoa(closeCodes[i])
		}
		for by, who := range []string{"edge", "peer"} {
			x.closeOpts[i][by] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("code", code), attribute.String("by", who)))}
		}
	}
	x.zero()
	return &x
}

// zero makes every counter series exist from the start, at 0. (The
// histogram appears with its first observation.)
func (m *metrics) zero() {
	m.conns.Add(bg, 0)
	m.draining.Add(bg, 0)
	for _, byWho := range m.closeOpts {
		for _, opts := range byWho {
			m.closes.Add(bg, 0, opts...)
		}
	}
	for _, opts := range m.byReason.Known() {
		m.slowReaders.Add(bg, 0, opts...)
	}
	for _, opts := range m.byStage.Known() {
		m.acceptFails.Add(bg, 0, opts...)
	}
	for _, c := range []metric.Int64Counter{m.dedupHits, m.uploadBytes, m.outboxOut, m.moved, m.unacked, m.evictions} {
		c.Add(bg, 0)
	}
	for _, opts := range m.byType.All() {
		m.framesIn.Add(bg, 0, opts...)
		m.framesOut.Add(bg, 0, opts...)
	}
	for _, opts := range m.byCode.All() {
		m.errors.Add(bg, 0, opts...)
	}
	for _, opts := range m.byResult.All() {
		m.handshakes.Add(bg, 0, opts...)
	}
}

// observeBudgets reports the edge's budgets, read at each collection
// (their series exist from now on). The returned stop ends the reporting.
func (m *metrics) observeBudgets(budgets [len(budgetNames)]*budget) (stop func() error) {
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, b := range budgets {
			o.ObserveInt64(m.budgetUsed, b.inUse(), m.budgetOpts[i])
			o.ObserveInt64(m.budgetLimit, b.limit, m.budgetOpts[i])
			o.ObserveInt64(m.budgetFull, b.refused.Load(), m.budgetOpts[i])
		}
		return nil
	}, m.budgetUsed, m.budgetLimit, m.budgetFull)
	if err != nil {
		return func() error { return nil } // the instruments are this meter's: it cannot fail
	}
	return reg.Unregister
}

// helloReady records a hello that got ready d after it arrived.
func (m *metrics) helloReady(d time.Duration) {
	m.handshakes.Add(bg, 1, m.byResult.Of(handshakeOK)...)
	m.helloTime.Record(bg, d.Seconds())
}

// connOpened counts a WebSocket connection that completed its upgrade.
func (m *metrics) connOpened() { m.conns.Add(bg, 1) }

// connClosed counts a connection that connOpened counted going away after
// it was open for d: code is the close code that ended it (the one of the
// close frame that began the closing handshake, 1005 for a close frame
// without a code, 1006 when the socket ended without any), byPeer whether
// the app began it (by its close frame, or by dropping the connection)
// rather than the edge.
func (m *metrics) connClosed(code int, byPeer bool, d time.Duration) {
	m.conns.Add(bg, -1)
	i := len(closeCodes) // other
	for j, c := range closeCodes {
		if c == code {
			i = j
			break
		}
	}
	by := 0
	if byPeer {
		by = 1
	}
	m.closes.Add(bg, 1, m.closeOpts[i][by]...)
	m.connDuration.Record(bg, d.Seconds())
}

// setDraining counts the edge beginning (+1) or ending (-1) its drain.
func (m *metrics) setDraining(delta int) { m.draining.Add(bg, int64(delta)) }

// slowReaderClosed counts a connection cut for not reading.
func (m *metrics) slowReaderClosed(reason string) {
	m.slowReaders.Add(bg, 1, m.byReason.Of(reason)...)
}

// acceptFailed counts a connection lost at stage.
func (m *metrics) acceptFailed(stage string) { m.acceptFails.Add(bg, 1, m.byStage.Of(stage)...) }

// helloEvicted counts a stranger closed to give its place in the hello
// phase to a newcomer.
func (m *metrics) helloEvicted() { m.evictions.Add(bg, 1) }

// handshake counts a hello by its result: handshakeOK or an error code.
func (m *metrics) handshake(result string) { m.handshakes.Add(bg, 1, m.byResult.Of(result)...) }

// frameIn counts a message from an app by its frame type (frameUnknown,
// frameInvalid for those without one).
func (m *metrics) frameIn(frameType string) { m.framesIn.Add(bg, 1, m.byType.Of(frameType)...) }

// frameOutBytes counts a frame queued for an app by its type.
func (m *metrics) frameOutBytes(frameType []byte) {
	m.framesOut.Add(bg, 1, m.byType.OfBytes(frameType)...)
}

// error counts an error frame sent to an app.
func (m *metrics) error(code string) { m.errors.Add(bg, 1, m.byCode.Of(code)...) }

// dedupHit counts a repeated id that was dropped.
func (m *metrics) dedupHit() { m.dedupHits.Add(bg, 1) }

// upload counts n bytes of a media chunk taken into an upload buffer.
func (m *metrics) upload(n int) {
	if n > 0 {
		m.uploadBytes.Add(bg, int64(n))
	}
}

// outboxDelivered counts n outbox items written after a ready.
func (m *metrics) outboxDelivered(n int) {
	if n > 0 {
		m.outboxOut.Add(bg, int64(n))
	}
}

// deliveryMoved counts a delivery answered moved after its write: the
// device had a newer owner.
func (m *metrics) deliveryMoved() { m.moved.Add(bg, 1) }

// deliveryUnacked counts a delivery the phone did not ack in time.
func (m *metrics) deliveryUnacked() { m.unacked.Add(bg, 1) }
