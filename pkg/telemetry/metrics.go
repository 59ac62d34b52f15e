package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"
)

// Metrics are the instruments of what every process may use, whichever
// parts it runs: the NATS connection, the Redis client and the router's
// HTTP API. The edge and the router define their own instruments where
// they record them (pkg/edge, pkg/router), on Telemetry.Meter. Every
// method is safe on a nil *Metrics (it does nothing). docs/metrics.md
// lists the names.
type Metrics struct {
	meter           metric.Meter
	redisErrors     metric.Int64Counter
	redisHits       metric.Int64ObservableCounter
	redisMisses     metric.Int64ObservableCounter
	redisTimeouts   metric.Int64ObservableCounter
	redisConns      metric.Int64ObservableGauge
	redisIdle       metric.Int64ObservableGauge
	redisMax        metric.Int64ObservableGauge
	redisDuration   metric.Float64Histogram
	natsDisconnects metric.Int64Counter
	natsReconnects  metric.Int64Counter
	natsSlow        metric.Int64Counter
	outboxDropped   metric.Int64Counter
	outboxLength    metric.Int64Histogram
	quotaRefusals   metric.Int64Counter

	httpRequests metric.Int64Counter
	httpDuration httpconv.ServerRequestDuration

	byKind   LabelSet // RedisUnavailable, RedisFull, RedisReply → {kind=…}
	byReason LabelSet // OutboxFull, OutboxBytes, OutboxStore, OutboxShare, OutboxExpired → {reason=…}
	byQuota  LabelSet // QuotaEventReads, QuotaConnections, QuotaDeliveries → {quota=…}
}

// LabelSet holds the precomputed options of one attribute's values, so
// that recording with a label allocates nothing, and a value outside the
// set is recorded as "other": a client cannot grow the number of series.
type LabelSet struct {
	add   map[string][]metric.AddOption
	other []metric.AddOption
}

// NewLabelSet is the LabelSet of attribute key with the given values and
// "other".
func NewLabelSet(key string, values ...string) LabelSet {
	opt := func(v string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(key, v)))}
	}
	s := LabelSet{add: make(map[string][]metric.AddOption, len(values)), other: opt("other")}
	for _, v := range values {
		s.add[v] = opt(v)
	}
	return s
}

// All returns the options of every value, "other" included.
func (s *LabelSet) All() [][]metric.AddOption {
	out := [][]metric.AddOption{s.other}
	for _, o := range s.add {
		out = append(out, o)
	}
	return out
}

// Known returns the options of every value but "other".
func (s *LabelSet) Known() [][]metric.AddOption {
	out := make([][]metric.AddOption, 0, len(s.add))
	for _, o := range s.add {
		out = append(out, o)
	}
	return out
}

// Of returns the options of v, or of "other" when v is not in the set.
func (s *LabelSet) Of(v string) []metric.AddOption {
	if o, ok := s.add[v]; ok {
		return o
	}
	return s.other
}

// OfBytes is Of(string(v)) without the conversion's allocation.
func (s *LabelSet) OfBytes(v []byte) []metric.AddOption {
	if o, ok := s.add[string(v)]; ok { // no allocation for a map index
		return o
	}
	return s.other
}

// Instruments collects the errors of creating a component's instruments:
// each Check adds one, Err reports them together.
type Instruments struct{ err error }

// Check records e, if set.
func (in *Instruments) Check(e error) { in.err = errors.Join(in.err, e) }

// Err is every error Check saw, joined; nil if none.
func (in *Instruments) Err() error { return in.err }

func newMetrics(m metric.Meter) (*Metrics, error) {
	x := Metrics{meter: m}
	var in Instruments
	var e error
	x.redisErrors, e = m.Int64Counter("hermes_redis_errors",
		metric.WithDescription("Store operations Redis failed, by kind: unavailable (network, timeout, a server loading or failing over), full (OOM), reply (any other error reply)."))
	in.Check(e)
	x.redisHits, e = m.Int64ObservableCounter("hermes_redis_pool_hits",
		metric.WithDescription("Redis commands that found an idle connection in the pool."))
	in.Check(e)
	x.redisMisses, e = m.Int64ObservableCounter("hermes_redis_pool_misses",
		metric.WithDescription("Redis commands that found no idle connection in the pool and took a new one or waited."))
	in.Check(e)
	x.redisTimeouts, e = m.Int64ObservableCounter("hermes_redis_pool_timeouts",
		metric.WithDescription("Redis commands that gave up waiting for a pool connection (PoolTimeout)."))
	in.Check(e)
	x.redisConns, e = m.Int64ObservableGauge("hermes_redis_pool_connections",
		metric.WithDescription("Connections in the Redis pool, idle or in use."))
	in.Check(e)
	x.redisIdle, e = m.Int64ObservableGauge("hermes_redis_pool_idle_connections",
		metric.WithDescription("Idle connections in the Redis pool."))
	in.Check(e)
	x.redisDuration, e = m.Float64Histogram("hermes_redis_command_duration", metric.WithUnit("s"),
		metric.WithDescription("Redis commands and pipelines, from the call (the wait for a pool connection included) to the reply or error."),
		metric.WithExplicitBucketBoundaries(redisBuckets...))
	in.Check(e)
	x.outboxDropped, e = m.Int64Counter("hermes_outbox_dropped",
		metric.WithDescription("Outbox items dropped unwritten, by reason: full (past the most items a device's outbox keeps), bytes (past the bytes a device's outbox keeps), store (past the bytes every outbox together keeps), share (past the bytes an owner's outboxes keep, its outbox_mib), expired (older than the outbox TTL)."))
	in.Check(e)
	x.outboxLength, e = m.Int64Histogram("hermes_outbox_length",
		metric.WithDescription("Items in a device's outbox right after an item was pushed."),
		metric.WithExplicitBucketBoundaries(outboxBuckets...))
	in.Check(e)
	x.natsSlow, e = m.Int64Counter("hermes_nats_slow_consumers",
		metric.WithDescription("Times a NATS subscription of this process fell behind and began dropping messages (slow consumer)."))
	in.Check(e)
	x.redisMax, e = m.Int64ObservableGauge("hermes_redis_pool_max_connections",
		metric.WithDescription("The most connections the Redis pool keeps for commands (REDIS_POOL_SIZE, or pool_size in REDIS_URL)."))
	in.Check(e)
	x.natsDisconnects, e = m.Int64Counter("hermes_nats_disconnects",
		metric.WithDescription("Times this process's NATS connection was lost (not counting its own close)."))
	in.Check(e)
	x.natsReconnects, e = m.Int64Counter("hermes_nats_reconnects",
		metric.WithDescription("Times this process's NATS connection was re-established after a loss."))
	in.Check(e)
	x.httpRequests, e = m.Int64Counter("hermes_http_requests",
		metric.WithDescription("Requests the router's HTTP API answered, by route, method and status class."))
	in.Check(e)
	x.httpDuration, e = httpconv.NewServerRequestDuration(m)
	in.Check(e)
	x.quotaRefusals, e = m.Int64Counter("hermes_quota_refusals",
		metric.WithDescription("Requests and hellos refused because their owner (docs/tenancy.md) had used its quota, by quota: event_reads (GET /v1/events answered 429), connections (a hello answered with an error)."))
	in.Check(e)
	if err := in.Err(); err != nil {
		return nil, err
	}
	x.byKind = NewLabelSet("kind", RedisUnavailable, RedisFull, RedisReply)
	x.byReason = NewLabelSet("reason", OutboxFull, OutboxBytes, OutboxStore, OutboxShare, OutboxExpired)
	x.byQuota = NewLabelSet("quota", QuotaEventReads, QuotaConnections, QuotaDeliveries)
	for _, o := range x.byQuota.Known() {
		x.quotaRefusals.Add(bg, 0, o...)
	}
	return &x, nil
}

// redisBuckets (seconds) run from a loopback command to a call at the end
// of its 5 s operation timeout and beyond.
var redisBuckets = []float64{0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// outboxBuckets (items) run up to the 1024 a device's outbox keeps.
var outboxBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

var bg = context.Background()

// NATSConnected makes the NATS series exist, at 0, for a process that has
// a NATS connection.
func (m *Metrics) NATSConnected() {
	if m != nil {
		m.natsDisconnects.Add(bg, 0)
		m.natsReconnects.Add(bg, 0)
		m.natsSlow.Add(bg, 0)
	}
}

// NATSSlowConsumer counts a subscription that began dropping messages.
func (m *Metrics) NATSSlowConsumer() {
	if m != nil {
		m.natsSlow.Add(bg, 1)
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
	Max                    int64  // the pool's size
}

// Kinds of Redis errors (the kind label).
const (
	RedisUnavailable = "unavailable" // network, timeout, closed client, LOADING, READONLY, …: a retry may succeed
	RedisFull        = "full"        // OOM: maxmemory reached
	RedisReply       = "reply"       // any other error reply: configuration or a bug
)

// Reasons an outbox item is dropped unwritten (the reason label).
const (
	OutboxFull    = "full"    // pushed out by newer items past the outbox's most
	OutboxBytes   = "bytes"   // pushed out past the bytes a device's outbox keeps
	OutboxStore   = "store"   // pushed out past the bytes every outbox together keeps
	OutboxShare   = "share"   // pushed out past the bytes its share (an owner's outbox_mib) keeps
	OutboxExpired = "expired" // older than the outbox TTL
)

// Quotas of an owner that refuse something (the quota label).
const (
	QuotaEventReads  = "event_reads"           // GET /v1/events past the owner's open reads
	QuotaConnections = "connections"           // a hello past the owner's open sockets
	QuotaDeliveries  = "deliveries_per_second" // POST /v1/deliver[/batch] past the owner's rate
)

// QuotaRefused counts one request or hello refused past its owner's
// quota (QuotaEventReads, QuotaConnections, QuotaDeliveries).
func (m *Metrics) QuotaRefused(quota string) {
	if m != nil {
		m.quotaRefusals.Add(bg, 1, m.byQuota.Of(quota)...)
	}
}

// ObserveRedis reports pool's stats, read at each collection, as the
// hermes_redis_pool_* series, and makes hermes_redis_errors_total and
// hermes_outbox_dropped_total exist at 0, for a process that uses Redis. The returned stop ends the reporting.
func (m *Metrics) ObserveRedis(pool func() PoolStats) (stop func() error) {
	if m == nil {
		return func() error { return nil }
	}
	for _, opts := range m.byKind.Known() {
		m.redisErrors.Add(bg, 0, opts...)
	}
	for _, opts := range m.byReason.Known() {
		m.outboxDropped.Add(bg, 0, opts...)
	}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := pool()
		o.ObserveInt64(m.redisHits, int64(st.Hits))
		o.ObserveInt64(m.redisMisses, int64(st.Misses))
		o.ObserveInt64(m.redisTimeouts, int64(st.Timeouts))
		o.ObserveInt64(m.redisConns, st.Conns)
		o.ObserveInt64(m.redisIdle, st.Idle)
		o.ObserveInt64(m.redisMax, st.Max)
		return nil
	}, m.redisHits, m.redisMisses, m.redisTimeouts, m.redisConns, m.redisIdle, m.redisMax)
	if err != nil {
		return func() error { return nil } // the instruments are this meter's: it cannot fail
	}
	return reg.Unregister
}

// RedisError counts a store operation Redis failed, by kind.
func (m *Metrics) RedisError(kind string) {
	if m != nil {
		m.redisErrors.Add(bg, 1, m.byKind.Of(kind)...)
	}
}

// RedisCommand records a Redis command or pipeline that took d.
func (m *Metrics) RedisCommand(d time.Duration) {
	if m != nil {
		m.redisDuration.Record(bg, d.Seconds())
	}
}

// OutboxPushed records a push that left length items in a device's outbox.
func (m *Metrics) OutboxPushed(length int64) {
	if m == nil {
		return
	}
	m.outboxLength.Record(bg, length)
}

// OutboxDropped counts n outbox items dropped unwritten for reason
// (OutboxFull, OutboxBytes, OutboxStore, OutboxShare, OutboxExpired).
func (m *Metrics) OutboxDropped(reason string, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.outboxDropped.Add(bg, n, m.byReason.Of(reason)...)
}
