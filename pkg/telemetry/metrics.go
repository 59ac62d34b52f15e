package telemetry

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// Metrics are the gateway's instruments, created once per Telemetry. Every
// method is safe on a nil *Metrics (it does nothing) and allocates nothing:
// attribute sets are built up front for every frame type and error code, and
// a value outside those sets is counted under "other", so a client cannot
// grow the number of series. docs/metrics.md lists the names.
type Metrics struct {
	conns       metric.Int64UpDownCounter
	handshakes  metric.Int64Counter
	framesIn    metric.Int64Counter
	framesOut   metric.Int64Counter
	errors      metric.Int64Counter
	dedupHits   metric.Int64Counter
	uploadBytes metric.Int64Counter
	outboxIn    metric.Int64Counter
	outboxOut   metric.Int64Counter
	latency     metric.Float64Histogram
	dropped     metric.Int64Counter
	moved       metric.Int64Counter
	unacked     metric.Int64Counter

	closes       metric.Int64Counter
	connDuration metric.Float64Histogram
	draining     metric.Int64UpDownCounter
	slowReaders  metric.Int64Counter
	acceptFails  metric.Int64Counter

	meter           metric.Meter
	redisErrors     metric.Int64Counter
	redisHits       metric.Int64ObservableCounter
	redisMisses     metric.Int64ObservableCounter
	redisTimeouts   metric.Int64ObservableCounter
	redisConns      metric.Int64ObservableGauge
	redisIdle       metric.Int64ObservableGauge
	natsDisconnects metric.Int64Counter
	natsReconnects  metric.Int64Counter

	httpRequests metric.Int64Counter
	httpDuration httpconv.ServerRequestDuration

	byType   labelSet // frame type → {type=…}
	byCode   labelSet // error code → {code=…}
	byResult labelSet // "ok" or an error code → {result=…}
	byReason labelSet // SlowReaderQueueFull, SlowReaderStalled → {reason=…}
	byStage  labelSet // AcceptStageAccept, AcceptStageUpgrade → {stage=…}
	byKind   labelSet // RedisUnavailable, RedisFull, RedisReply → {kind=…}
	// closeOpts[i][by] are the options of closeCodes[i] (the last one
	// "other") closed by the edge (by 0) or the peer (by 1).
	closeOpts [][2][]metric.AddOption
}

// labelSet holds the precomputed options of one attribute's values.
type labelSet struct {
	add   map[string][]metric.AddOption
	other []metric.AddOption
}

func newLabelSet(key string, values ...string) labelSet {
	opt := func(v string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(key, v)))}
	}
	s := labelSet{add: make(map[string][]metric.AddOption, len(values)), other: opt("other")}
	for _, v := range values {
		s.add[v] = opt(v)
	}
	return s
}

// all returns the options of every value, "other" included.
func (s *labelSet) all() [][]metric.AddOption {
	out := [][]metric.AddOption{s.other}
	for _, o := range s.add {
		out = append(out, o)
	}
	return out
}

func (s *labelSet) of(v string) []metric.AddOption {
	if o, ok := s.add[v]; ok {
		return o
	}
	return s.other
}

// frameTypes are the type label values: every Protocol v1 frame type, plus
// "unknown" (a well-formed frame of a type the gateway ignores) and
// "invalid" (a frame that failed decoding or validation).
var frameTypes = []string{
	protocol.TypeHello, protocol.TypeText, protocol.TypeAudio, protocol.TypeMedia, protocol.TypePrompt,
	protocol.TypeTyping, protocol.TypePing, protocol.TypeAck, protocol.TypeDeliver, protocol.TypeReady,
	protocol.TypeMessage, protocol.TypePromptDone, protocol.TypeAvatar, protocol.TypePong, protocol.TypeError,
	FrameUnknown, FrameInvalid,
}

// Type label values for frames that have no Protocol v1 type.
const (
	FrameUnknown = "unknown"
	FrameInvalid = "invalid"
)

var errorCodes = []string{
	string(protocol.CodeBadFrame), string(protocol.CodeAuthFailed), string(protocol.CodeForbidden),
	string(protocol.CodeUnsupportedFrame), string(protocol.CodeTooBig), string(protocol.CodeDeviceOffline),
	string(protocol.CodeAuthRequired), string(protocol.CodeInternalError),
}

// HandshakeOK is the result label of a hello that ended in ready; a refused
// hello is labelled with the error code it got.
const HandshakeOK = "ok"

// latencyBuckets (seconds) cover a loopback write (sub-millisecond) up to
// the 15 s a delivery may take.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15}

func newMetrics(m metric.Meter) (*Metrics, error) {
	x := Metrics{meter: m}
	var err, e error
	check := func(e error) { err = errors.Join(err, e) }
	x.conns, e = m.Int64UpDownCounter("hermes_connections",
		metric.WithDescription("Open WebSocket connections on this edge."))
	check(e)
	x.handshakes, e = m.Int64Counter("hermes_handshakes",
		metric.WithDescription("Hellos answered, by result: ok or the error code of the refusal."))
	check(e)
	x.framesIn, e = m.Int64Counter("hermes_frames_in",
		metric.WithDescription("WebSocket messages received from apps, by frame type."))
	check(e)
	x.framesOut, e = m.Int64Counter("hermes_frames_out",
		metric.WithDescription("Frames queued for apps' sockets, by frame type."))
	check(e)
	x.errors, e = m.Int64Counter("hermes_errors",
		metric.WithDescription("Error frames sent to apps, by error code."))
	check(e)
	x.dedupHits, e = m.Int64Counter("hermes_dedup_hits",
		metric.WithDescription("Repeated text, audio and media ids dropped as duplicates."))
	check(e)
	x.uploadBytes, e = m.Int64Counter("hermes_upload", metric.WithUnit("By"),
		metric.WithDescription("Bytes of multi-part media chunks taken into upload buffers."))
	check(e)
	x.outboxIn, e = m.Int64Counter("hermes_outbox_queued",
		metric.WithDescription("Agent outputs kept in an offline device's outbox."))
	check(e)
	x.outboxOut, e = m.Int64Counter("hermes_outbox_delivered",
		metric.WithDescription("Outbox items written to a device after its ready."))
	check(e)
	x.latency, e = m.Float64Histogram("hermes_delivery_latency", metric.WithUnit("s"),
		metric.WithDescription("From the router sending an output to the owning edge acknowledging its write to the socket."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	check(e)
	x.dropped, e = m.Int64Counter("hermes_journal_dropped",
		metric.WithDescription("Device events dropped unhandled after their routers died on them MaxAttempts times."))
	check(e)
	x.moved, e = m.Int64Counter("hermes_deliveries_moved",
		metric.WithDescription("Deliveries written to a socket whose device had a newer owner by then (an edge that was paused): answered moved, sent again to the owner."))
	check(e)
	x.unacked, e = m.Int64Counter("hermes_deliveries_unacked",
		metric.WithDescription("Deliveries to a phone that acks which it did not ack in time or before its socket closed: kept for the outbox."))
	check(e)
	x.closes, e = m.Int64Counter("hermes_closes",
		metric.WithDescription("WebSocket connections closed, by the close code that ended them and by whom the close began."))
	check(e)
	x.connDuration, e = m.Float64Histogram("hermes_connection_duration", metric.WithUnit("s"),
		metric.WithDescription("How long WebSocket connections stayed open, from the upgrade to the socket closing."),
		metric.WithExplicitBucketBoundaries(connDurationBuckets...))
	check(e)
	x.draining, e = m.Int64UpDownCounter("hermes_draining",
		metric.WithDescription("1 while this edge drains: it accepts no connections and closes its own one by one."))
	check(e)
	x.slowReaders, e = m.Int64Counter("hermes_slow_reader_closes",
		metric.WithDescription("Connections cut because the app did not read: its outbound queue was full, or a write made no progress for WriteTimeout."))
	check(e)
	x.acceptFails, e = m.Int64Counter("hermes_accept_failures",
		metric.WithDescription("Connections the edge could not take: the listener's accept failed, or the WebSocket upgrade did."))
	check(e)
	x.redisErrors, e = m.Int64Counter("hermes_redis_errors",
		metric.WithDescription("Store operations Redis failed, by kind: unavailable (network, timeout, a server loading or failing over), full (OOM), reply (any other error reply)."))
	check(e)
	x.redisHits, e = m.Int64ObservableCounter("hermes_redis_pool_hits",
		metric.WithDescription("Redis commands that found an idle connection in the pool."))
	check(e)
	x.redisMisses, e = m.Int64ObservableCounter("hermes_redis_pool_misses",
		metric.WithDescription("Redis commands that found no idle connection in the pool and took a new one or waited."))
	check(e)
	x.redisTimeouts, e = m.Int64ObservableCounter("hermes_redis_pool_timeouts",
		metric.WithDescription("Redis commands that gave up waiting for a pool connection (PoolTimeout)."))
	check(e)
	x.redisConns, e = m.Int64ObservableGauge("hermes_redis_pool_connections",
		metric.WithDescription("Connections in the Redis pool, idle or in use."))
	check(e)
	x.redisIdle, e = m.Int64ObservableGauge("hermes_redis_pool_idle_connections",
		metric.WithDescription("Idle connections in the Redis pool."))
	check(e)
	x.natsDisconnects, e = m.Int64Counter("hermes_nats_disconnects",
		metric.WithDescription("Times this process's NATS connection was lost (not counting its own close)."))
	check(e)
	x.natsReconnects, e = m.Int64Counter("hermes_nats_reconnects",
		metric.WithDescription("Times this process's NATS connection was re-established after a loss."))
	check(e)
	x.httpRequests, e = m.Int64Counter("hermes_http_requests",
		metric.WithDescription("Requests the router's HTTP API answered, by route, method and status class."))
	check(e)
	x.httpDuration, e = httpconv.NewServerRequestDuration(m)
	check(e)
	if err != nil {
		return nil, err
	}
	x.byType = newLabelSet("type", frameTypes...)
	x.byCode = newLabelSet("code", errorCodes...)
	x.byResult = newLabelSet("result", append([]string{HandshakeOK}, errorCodes...)...)
	x.byReason = newLabelSet("reason", SlowReaderQueueFull, SlowReaderStalled)
	x.byStage = newLabelSet("stage", AcceptStageAccept, AcceptStageUpgrade)
	x.byKind = newLabelSet("kind", RedisUnavailable, RedisFull, RedisReply)
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
	return &x, nil
}

// zero makes every counter series exist from the start, at 0, so that
// increase() and alerts see the first event. (The histogram appears with
// its first delivery.)
func (m *Metrics) zero() {
	m.conns.Add(bg, 0)
	m.draining.Add(bg, 0)
	for _, byWho := range m.closeOpts {
		for _, opts := range byWho {
			m.closes.Add(bg, 0, opts...)
		}
	}
	for _, opts := range m.byReason.add {
		m.slowReaders.Add(bg, 0, opts...)
	}
	for _, opts := range m.byStage.add {
		m.acceptFails.Add(bg, 0, opts...)
	}
	for _, c := range []metric.Int64Counter{m.dedupHits, m.uploadBytes, m.outboxIn, m.outboxOut, m.dropped, m.moved, m.unacked} {
		c.Add(bg, 0)
	}
	for _, opts := range m.byType.all() {
		m.framesIn.Add(bg, 0, opts...)
		m.framesOut.Add(bg, 0, opts...)
	}
	for _, opts := range m.byCode.all() {
		m.errors.Add(bg, 0, opts...)
	}
	for _, opts := range m.byResult.all() {
		m.handshakes.Add(bg, 0, opts...)
	}
}

var bg = context.Background()

// ConnOpened counts a WebSocket connection that completed its upgrade.
func (m *Metrics) ConnOpened() {
	if m != nil {
		m.conns.Add(bg, 1)
	}
}

// ConnClosed counts a connection that ConnOpened counted going away after
// it was open for d: code is the close code that ended it (the one of the
// close frame that began the closing handshake, 1005 for a close frame
// without a code, 1006 when the socket ended without any), byPeer whether
// the app began it (by its close frame, or by dropping the connection)
// rather than the edge.
func (m *Metrics) ConnClosed(code int, byPeer bool, d time.Duration) {
	if m == nil {
		return
	}
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

// closeCodes are the code label values (RFC 6455 7.4.1): the codes the
// edge sends (1000, 1001, 1002, 1007, 1008), those apps commonly send,
// 1005 (a close frame without a code) and 1006 (no close frame). Any other
// code counts as "other".
var closeCodes = []int{1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1011}

// connDurationBuckets (seconds) run from a refused hello to a phone that
// stays a day.
var connDurationBuckets = []float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400}

// Draining counts an edge beginning (+1) or ending (-1) its drain.
func (m *Metrics) Draining(delta int) {
	if m != nil {
		m.draining.Add(bg, int64(delta))
	}
}

// Reasons a slow reader is cut (the reason label).
const (
	SlowReaderQueueFull = "queue_full"    // MaxOutboundBytes queued unwritten, or the edge-wide MaxQueuedBytes passed
	SlowReaderStalled   = "write_stalled" // no write progress for WriteTimeout
)

// SlowReaderClosed counts a connection cut for not reading.
func (m *Metrics) SlowReaderClosed(reason string) {
	if m != nil {
		m.slowReaders.Add(bg, 1, m.byReason.of(reason)...)
	}
}

// Stages a connection can fail at before it is open (the stage label).
const (
	AcceptStageAccept  = "accept"  // the listener's Accept failed (out of files, …)
	AcceptStageUpgrade = "upgrade" // the HTTP request was no valid WebSocket upgrade of /ws, or did not complete in time
)

// AcceptFailed counts a connection lost at stage.
func (m *Metrics) AcceptFailed(stage string) {
	if m != nil {
		m.acceptFails.Add(bg, 1, m.byStage.of(stage)...)
	}
}

// Handshake counts a hello by its result: HandshakeOK or an error code.
func (m *Metrics) Handshake(result string) {
	if m != nil {
		m.handshakes.Add(bg, 1, m.byResult.of(result)...)
	}
}

// FrameIn counts a message from an app by its frame type (FrameUnknown,
// FrameInvalid for those without one).
func (m *Metrics) FrameIn(frameType string) {
	if m != nil {
		m.framesIn.Add(bg, 1, m.byType.of(frameType)...)
	}
}

// FrameOut counts n frames of one type queued for an app.
func (m *Metrics) FrameOut(frameType string, n int) {
	if m != nil && n > 0 {
		m.framesOut.Add(bg, int64(n), m.byType.of(frameType)...)
	}
}

// FrameOutBytes is FrameOut(string(frameType), 1) without the conversion.
func (m *Metrics) FrameOutBytes(frameType []byte) {
	if m == nil {
		return
	}
	opts, ok := m.byType.add[string(frameType)] // no allocation for a map index
	if !ok {
		opts = m.byType.other
	}
	m.framesOut.Add(bg, 1, opts...)
}

// Error counts an error frame sent to an app.
func (m *Metrics) Error(code string) {
	if m != nil {
		m.errors.Add(bg, 1, m.byCode.of(code)...)
	}
}

// DedupHit counts a repeated id that was dropped.
func (m *Metrics) DedupHit() {
	if m != nil {
		m.dedupHits.Add(bg, 1)
	}
}

// UploadBytes counts n bytes of a media chunk taken into an upload buffer.
func (m *Metrics) UploadBytes(n int) {
	if m != nil && n > 0 {
		m.uploadBytes.Add(bg, int64(n))
	}
}

// OutboxQueued counts an output kept for an offline device.
func (m *Metrics) OutboxQueued() {
	if m != nil {
		m.outboxIn.Add(bg, 1)
	}
}

// OutboxDelivered counts n outbox items written after a ready.
func (m *Metrics) OutboxDelivered(n int) {
	if m != nil && n > 0 {
		m.outboxOut.Add(bg, int64(n))
	}
}

// DeliveryLatency records how long an acknowledged delivery took.
func (m *Metrics) DeliveryLatency(d time.Duration) {
	if m != nil {
		m.latency.Record(bg, d.Seconds())
	}
}

// DeliveryMoved counts a delivery answered moved after its write: the
// device had a newer owner.
func (m *Metrics) DeliveryMoved() {
	if m != nil {
		m.moved.Add(bg, 1)
	}
}

// DeliveryUnacked counts a delivery the phone did not ack in time.
func (m *Metrics) DeliveryUnacked() {
	if m != nil {
		m.unacked.Add(bg, 1)
	}
}

// JournalDropped counts a device event given up on after its routers died
// on it too often.
func (m *Metrics) JournalDropped() {
	if m != nil {
		m.dropped.Add(bg, 1)
	}
}

// NATSConnected makes the NATS series exist, at 0, for a process that has
// a NATS connection.
func (m *Metrics) NATSConnected() {
	if m != nil {
		m.natsDisconnects.Add(bg, 0)
		m.natsReconnects.Add(bg, 0)
	}
}

// NATSDisconnected counts a lost NATS connection.
func (m *Metrics) NATSDisconnected() {
	if m != nil {
		m.natsDisconnects.Add(bg, 1)
	}
}

// NATSReconnected counts a NATS connection re-established.
func (m *Metrics) NATSReconnected() {
	if m != nil {
		m.natsReconnects.Add(bg, 1)
	}
}

// PoolStats is what a Redis connection pool reports (go-redis PoolStats).
type PoolStats struct {
	Hits, Misses, Timeouts uint64 // since the pool was made
	Conns, Idle            int64  // now
}

// Kinds of Redis errors (the kind label).
const (
	RedisUnavailable = "unavailable" // network, timeout, closed client, LOADING, READONLY, …: a retry may succeed
	RedisFull        = "full"        // OOM: maxmemory reached
	RedisReply       = "reply"       // any other error reply: configuration or a bug
)

// ObserveRedis reports pool's stats, read at each collection, as the
// hermes_redis_pool_* series, and makes hermes_redis_errors_total exist at
// 0, for a process that uses Redis. The returned stop ends the reporting.
func (m *Metrics) ObserveRedis(pool func() PoolStats) (stop func() error) {
	if m == nil {
		return func() error { return nil }
	}
	for _, opts := range m.byKind.add {
		m.redisErrors.Add(bg, 0, opts...)
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := pool()
		o.ObserveInt64(m.redisHits, int64(st.Hits))
		o.ObserveInt64(m.redisMisses, int64(st.Misses))
		o.ObserveInt64(m.redisTimeouts, int64(st.Timeouts))
		o.ObserveInt64(m.redisConns, st.Conns)
		o.ObserveInt64(m.redisIdle, st.Idle)
		return nil
	}, m.redisHits, m.redisMisses, m.redisTimeouts, m.redisConns, m.redisIdle)
	if err != nil {
		return func() error { return nil } // the instruments are this meter's: it cannot fail
	}
	return reg.Unregister
}

// RedisError counts a store operation Redis failed, by kind.
func (m *Metrics) RedisError(kind string) {
	if m != nil {
		m.redisErrors.Add(bg, 1, m.byKind.of(kind)...)
	}
}
