// Package usage counts what each owner (tenant, pkg/tenant) uses: its
// phones' connections and messages, cron's deliveries, the quotas that
// refused it. Every process counts in memory, without a store call or an
// allocation per event; the counts are the owner-labelled series of the
// process's /metrics (hermes_owner_*) and, added up over every node in
// the store once a second (Recorder.Run), what GET /v1/usage answers an
// owner. docs/tenancy.md and docs/metrics.md describe them.
package usage

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// Counter is one of an owner's counters.
type Counter int

// The counters. Their names (Name) are the store's and GET /v1/usage's.
const (
	// MessagesIn: texts, voice notes, files and card answers from the
	// owner's phones handed to the agent (duplicates not counted).
	MessagesIn Counter = iota
	// MessagesOut: messages, files and cards written to the owner's
	// phones' sockets, from the outbox too; a message's streamed edits
	// are the same message, and typing and avatar states are none.
	MessagesOut
	// DeliveriesAccepted: cron's deliveries (POST /v1/deliver, one of a
	// batch, a deliver frame) the gateway took: delivered, written or
	// queued (200 and 202).
	DeliveriesAccepted
	// DeliveriesOffline: cron's deliveries to a device that was not
	// online, with nothing kept (404 device_offline).
	DeliveriesOffline
	// ConnectionsOpened: the owner's hellos that got ready (its phones',
	// and cron's sockets of the deliver frame).
	ConnectionsOpened
	// RefusedOutbox, RefusedConnections, RefusedEventReads and
	// RefusedDeliveries: what the owner's quota (the file's quota:
	// outbox_mib, connections, event_reads, deliveries_per_second)
	// refused; for outbox_mib, the items dropped past it.
	RefusedOutbox
	RefusedConnections
	RefusedEventReads
	RefusedDeliveries
	numCounters
)

var counterNames = [numCounters]string{
	"messages_in", "messages_out", "deliveries_accepted", "deliveries_offline", "connections_opened",
	"refused_outbox_mib", "refused_connections", "refused_event_reads", "refused_deliveries_per_second",
}

// Name is c's name in the store and in GET /v1/usage.
func (c Counter) Name() string { return counterNames[c] }

// refusedBy is the counter of each quota's refusals, by the file's name of
// the quota (tenant.Quota*).
var refusedBy = map[string]Counter{tenant.QuotaOutbox: RefusedOutbox, tenant.QuotaConnections: RefusedConnections,
	tenant.QuotaEventReads: RefusedEventReads, tenant.QuotaDeliveries: RefusedDeliveries}

// LegacyLabel is the owner label of the legacy owner (tenant.Legacy, whose
// id is empty): no owner of the file can have it, since an owner id has
// no '_'.
const LegacyLabel = "_legacy"

// Label is the owner label of owner.
func Label(owner string) string {
	if owner == tenant.Legacy {
		return LegacyLabel
	}
	return owner
}

// Defaults.
const (
	// DefaultInterval is how often Run adds the counts to the store: what
	// GET /v1/usage answers lags the events by up to about this.
	DefaultInterval = time.Second
	// TTL is how long the store keeps an owner's counts after its last
	// add: an owner that uses nothing for this long counts from zero.
	TTL = 400 * 24 * time.Hour
	// flushTimeout bounds one add to the store.
	flushTimeout = 5 * time.Second
)

// Options configure a Recorder.
type Options struct {
	// Tenants are the owners counted: the file's, and the legacy owner.
	// Nil: the legacy owner only.
	Tenants *tenant.Registry
	// Store is where Flush adds the counts; nil keeps them in this
	// process (the metrics only).
	Store store.Usage
	// Meter makes the hermes_owner_* series; nil records none.
	Meter metric.Meter
	// Edge: the process runs an edge, so it serves the edge's series
	// (the sockets, the messages in and out) besides those of both sides
	// (the deliveries, the refusals). A process serves the series of the
	// parts it runs (docs/metrics.md).
	Edge bool
	// Interval is how often Run flushes (DefaultInterval).
	Interval time.Duration
	// Clock says when an owner's counting began (the store's since).
	Clock clock.Clock
	// Log tells of failed flushes; nil logs nothing.
	Log *slog.Logger
}

// Owner is one owner's counts in this process. A nil *Owner counts
// nothing: an owner that is not (or no longer) in the file.
type Owner struct {
	id     string
	counts [numCounters]atomic.Int64
	open   atomic.Int64 // the owner's sockets open on this edge
	// flushed is what the store has of counts (under Recorder.flushMu).
	flushed [numCounters]int64
	// opts are the series' attributes of each counter, and of the open
	// sockets: made once per owner, so a collection allocates none.
	opts     [numCounters]metric.ObserveOption
	openOpts metric.ObserveOption
}

// Add counts n of c.
func (o *Owner) Add(c Counter, n int64) {
	if o != nil {
		o.counts[c].Add(n)
	}
}

// Opened counts a socket of the owner that got ready: one more opened,
// and one more open until Closed.
func (o *Owner) Opened() {
	if o != nil {
		o.counts[ConnectionsOpened].Add(1)
		o.open.Add(1)
	}
}

// Closed counts a socket that Opened counted going away.
func (o *Owner) Closed() {
	if o != nil {
		o.open.Add(-1)
	}
}

// Recorder counts each owner's usage in one process. A nil *Recorder
// counts nothing.
type Recorder struct {
	opts Options
	log  *slog.Logger

	// owners are the owners counted now, by id: swapped whole on a reload
	// of the tenants file, read with no lock on every event.
	owners atomic.Pointer[map[string]*Owner]

	ownersMu sync.Mutex // a swap of owners, and retired
	// retired are owners a reload removed whose counts Flush has not
	// added yet.
	retired []*Owner

	flushMu sync.Mutex // one flush at a time: Owner.flushed

	stopWatch   func()
	unobserve   metric.Registration
	closeOnce   sync.Once
	open        metric.Int64ObservableUpDownCounter
	instruments [numCounters]metric.Int64ObservableCounter
}

// New returns a Recorder of opts.Tenants' owners (and of every owner a
// reload brings), whose series opts.Meter collects.
func New(opts Options) (*Recorder, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	opts.Clock = clock.Or(opts.Clock)
	r := &Recorder{opts: opts, log: opts.Log}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	m := opts.Meter
	if m == nil {
		m = noop.NewMeterProvider().Meter("usage")
	}
	// Subscribed before the first reading, under the lock a reload's
	// setOwners waits for: a reload in between is applied after it.
	r.ownersMu.Lock()
	r.stopWatch = opts.Tenants.OnChange(r.setOwners)
	r.setOwnersLocked(opts.Tenants.Snapshot())
	r.ownersMu.Unlock()
	if err := r.instrument(m); err != nil {
		r.stopWatch()
		return nil, err
	}
	return r, nil
}

// instrument makes the hermes_owner_* series, read from the owners' counts
// at each collection: an owner that a reload removed is no longer
// reported, so the series are bounded by the file's owners.
func (r *Recorder) instrument(m metric.Meter) error {
	var in telemetry.Instruments
	var obs []metric.Observable
	counter := func(name, desc string) metric.Int64ObservableCounter {
		c, e := m.Int64ObservableCounter(name, metric.WithDescription(desc))
		in.Check(e)
		obs = append(obs, c)
		return c
	}
	deliveries := counter("hermes_owner_deliveries", "Cron's deliveries of the owner, by result: accepted (delivered, written or queued) or offline.")
	refusals := counter("hermes_owner_quota_refusals", "What the owner's quotas refused, by quota: outbox_mib, connections, event_reads.")
	r.instruments[DeliveriesAccepted], r.instruments[DeliveriesOffline] = deliveries, deliveries
	r.instruments[RefusedOutbox], r.instruments[RefusedConnections], r.instruments[RefusedEventReads] = refusals, refusals, refusals
	if r.opts.Edge {
		var e error
		r.open, e = m.Int64ObservableUpDownCounter("hermes_owner_connections",
			metric.WithDescription("The owner's sockets open on this edge (those that got ready), by owner."))
		in.Check(e)
		obs = append(obs, r.open)
		r.instruments[ConnectionsOpened] = counter("hermes_owner_connections_opened", "The owner's hellos that got ready, by owner.")
		r.instruments[MessagesIn] = counter("hermes_owner_messages_in", "Texts, voice notes, files and card answers from the owner's phones handed to the agent, by owner.")
		r.instruments[MessagesOut] = counter("hermes_owner_messages_out", "Messages, files and cards written to the owner's phones, by owner.")
	}
	if err := in.Err(); err != nil {
		return fmt.Errorf("usage: creating the instruments: %w", err)
	}
	reg, err := m.RegisterCallback(r.observe, obs...)
	if err != nil {
		return fmt.Errorf("usage: registering the callback: %w", err)
	}
	r.unobserve = reg
	return nil
}

// observe reports every owner's counts (of the series the process
// serves).
func (r *Recorder) observe(_ context.Context, o metric.Observer) error {
	for _, ow := range *r.owners.Load() {
		if r.open != nil {
			o.ObserveInt64(r.open, ow.open.Load(), ow.openOpts)
		}
		for c := range numCounters {
			if r.instruments[c] != nil {
				o.ObserveInt64(r.instruments[c], ow.counts[c].Load(), ow.opts[c])
			}
		}
	}
	return nil
}

// newOwner is owner id's counts from zero, with its series' attributes.
func newOwner(id string) *Owner {
	o := &Owner{id: id}
	label := attribute.String("owner", Label(id))
	only := metric.WithAttributeSet(attribute.NewSet(label))
	o.openOpts = only
	for c := range numCounters {
		switch c {
		case DeliveriesAccepted:
			o.opts[c] = metric.WithAttributeSet(attribute.NewSet(label, attribute.String("result", "accepted")))
		case DeliveriesOffline:
			o.opts[c] = metric.WithAttributeSet(attribute.NewSet(label, attribute.String("result", "offline")))
		default:
			o.opts[c] = only
		}
	}
	for quota, c := range refusedBy {
		o.opts[c] = metric.WithAttributeSet(attribute.NewSet(label, attribute.String("quota", quota)))
	}
	return o
}

// setOwners makes the owners of s (and the legacy owner) the ones
// counted: an owner kept keeps its counts, a new one starts at zero, a
// removed one is counted no more (what it counted since the last flush
// is still flushed).
func (r *Recorder) setOwners(s *tenant.Snapshot) {
	r.ownersMu.Lock()
	defer r.ownersMu.Unlock()
	r.setOwnersLocked(s)
}

func (r *Recorder) setOwnersLocked(s *tenant.Snapshot) {
	var old map[string]*Owner
	if p := r.owners.Load(); p != nil {
		old = *p
	}
	next := make(map[string]*Owner, len(old)+1)
	keep := func(id string) {
		if o := old[id]; o != nil {
			next[id] = o
		} else {
			next[id] = newOwner(id)
		}
	}
	keep(tenant.Legacy)
	if s != nil {
		for _, t := range s.Tenants {
			keep(t.ID)
		}
	}
	for id, o := range old {
		if next[id] != o {
			r.retired = append(r.retired, o)
		}
	}
	r.owners.Store(&next)
}

// Owner is the counts of owner, to count with (a socket keeps its
// owner's); nil for an owner that is not counted.
func (r *Recorder) Owner(owner string) *Owner {
	if r == nil {
		return nil
	}
	return (*r.owners.Load())[owner]
}

// Add counts n of c for owner.
func (r *Recorder) Add(owner string, c Counter, n int64) { r.Owner(owner).Add(c, n) }

// Delivery counts one of owner's cron deliveries: accepted (the gateway
// took it: delivered, written or queued) or not (offline).
func (r *Recorder) Delivery(owner string, accepted bool) {
	c := DeliveriesOffline
	if accepted {
		c = DeliveriesAccepted
	}
	r.Owner(owner).Add(c, 1)
}

// Refused counts n refusals of owner's quota (tenant.QuotaOutbox,
// QuotaConnections, QuotaEventReads, QuotaDeliveries); another name
// counts nothing.
func (r *Recorder) Refused(owner, quota string, n int64) {
	if c, ok := refusedBy[quota]; ok {
		r.Owner(owner).Add(c, n)
	}
}

// Flush adds what every owner counted since the last flush to the store,
// in one call. When the call fails the counts stay for the next flush,
// so a store that is away loses nothing (a call whose reply was lost
// after the store took it has them counted twice).
func (r *Recorder) Flush(ctx context.Context) error {
	if r == nil || r.opts.Store == nil {
		return nil
	}
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.ownersMu.Lock()
	owners := append(r.retired, mapValues(*r.owners.Load())...)
	retired := len(r.retired)
	r.retired = nil
	r.ownersMu.Unlock()
	type taken struct {
		o   *Owner
		now [numCounters]int64
	}
	var took []taken
	add := make(map[string]store.UsageCounts)
	for _, o := range owners {
		t := taken{o: o}
		var counts store.UsageCounts
		for c := range numCounters {
			t.now[c] = o.counts[c].Load()
			if d := t.now[c] - o.flushed[c]; d != 0 {
				if counts == nil {
					counts = add[o.id]
					if counts == nil {
						counts = make(store.UsageCounts)
						add[o.id] = counts
					}
				}
				counts[c.Name()] += d
			}
		}
		if counts != nil {
			took = append(took, t)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := r.opts.Store.AddUsage(ctx, add, r.opts.Clock.Now(), TTL); err != nil {
		r.ownersMu.Lock()
		r.retired = append(r.retired, owners[:retired]...)
		r.ownersMu.Unlock()
		return err
	}
	for _, t := range took {
		t.o.flushed = t.now
	}
	return nil
}

func mapValues(m map[string]*Owner) []*Owner {
	out := make([]*Owner, 0, len(m))
	for _, o := range m {
		out = append(out, o)
	}
	return out
}

// Run flushes every Interval until ctx ends. A failed flush is logged
// (once until one succeeds again) and retried at the next.
func (r *Recorder) Run(ctx context.Context) {
	if r == nil || r.opts.Store == nil {
		return
	}
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fctx, cancel := context.WithTimeout(ctx, flushTimeout)
		err := r.Flush(fctx)
		cancel()
		switch {
		case err != nil && !failing:
			failing = true
			r.log.Warn("adding the owners' usage to the store failed; kept for the next try", "err", err)
		case err == nil && failing:
			failing = false
			r.log.Info("the owners' usage is added to the store again")
		}
	}
}

// Close stops following the tenants file and the series, and flushes
// what is left (the caller stops Run first, and closes the store after);
// a failed flush is logged, and its counts are lost.
func (r *Recorder) Close(ctx context.Context) error {
	if r == nil {
		return nil
	}
	var err error
	r.closeOnce.Do(func() {
		r.stopWatch()
		if r.unobserve != nil {
			_ = r.unobserve.Unregister()
		}
		if err = r.Flush(ctx); err != nil {
			r.log.Warn("adding the owners' last usage to the store failed; it is lost", "err", err)
		}
	})
	return err
}
