// Package router is the agent side of the gateway. It takes device events
// from the bus (one router of the queue group gets each), runs the agent for
// them one session at a time, delivers the agent's output to the edge that
// owns the device (or to the device's outbox while it is offline), and
// expires prompt cards.
//
// For the built-in agents an event is acknowledged only once it is in the
// device's journal in the store (journal.go); the router holding the
// journal's lease runs the agent for its entries, in order, and removes each
// after the agent call returns. A router that dies leaves its journals to
// the others once their leases expire: an event is handled at least once.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Config of a router. Zero values take the defaults.
type Config struct {
	// PromptTTL is a card's lifetime unless the agent asks for another
	// (MOBILE_PROMPT_TTL, 300 s).
	PromptTTL time.Duration
	// PromptMaxTTL bounds the lifetime an agent may ask for a card
	// (MOBILE_PROMPT_MAX_TTL, 24 h; never below PromptTTL). A card for a
	// wait without a limit (ttl -1) lives until answered or closed, at
	// most this long.
	PromptMaxTTL time.Duration
	// SessionQueue bounds the events waiting for the agent per session
	// (1000): the length of a device's journal. Past it new events are
	// refused and the phone retries.
	SessionQueue int
	// JournalLease is how long a router holds a device's journal without
	// renewing it (15 s); it renews every third of it while it works. A
	// router that dies leaves its journals to the others after this.
	JournalLease time.Duration
	// JournalTTL: a journal nobody works is forgotten this long after its
	// last append (24 h).
	JournalTTL time.Duration
	// MaxAttempts bounds the routers an event may take down (3): once a
	// device's oldest event was taken over from a router whose lease
	// expired this many times, it is dropped unhandled and the phone is
	// told, so an event that kills its router does not kill them all in
	// turn.
	MaxAttempts int
	// CloseGrace is how long Close lets agent calls in progress finish
	// before it cancels them (10 s); the events of canceled calls stay in
	// their journals for another router.
	CloseGrace time.Duration
	// SweepEvery is how often expired cards are looked for (250 ms).
	SweepEvery time.Duration
	// Clock sets when a card expires and when the sweep finds it expired
	// (the sweep's interval stays real time). Nil means the system clock;
	// give the store the same clock.
	Clock clock.Clock
	// HandleTimeout bounds one agent call (10 min).
	HandleTimeout time.Duration
	// BlobTTL is how long media the agent sends is kept for delivery (15 min).
	BlobTTL time.Duration
	// RetryFor is how long a delivery is retried while the bus or the store
	// fails before the output goes to the outbox (30 s).
	RetryFor time.Duration
	// OpTimeout bounds one call of the router to the store or the bus
	// (MOBILE_ROUTER_OP_TIMEOUT, 5 s): an event's append to its journal,
	// a journal's read, renewal and release, a sweep, an agent's Accept,
	// keeping an output in the outbox.
	OpTimeout time.Duration
	// Telemetry receives the router's metrics and spans; nil records nothing.
	Telemetry *telemetry.Telemetry
	// Outbox keeps the agent's output for a device that holds no socket,
	// and cron's deliveries with a ttl that the API takes; the API
	// registers push endpoints with its Notifier. Nil: New makes one of
	// dispatch.DefaultOutboxConfig (with Telemetry), which Close closes.
	Outbox *dispatch.Outbox
}

// DefaultPromptMaxTTL is the longest a card may live by default
// (MOBILE_PROMPT_MAX_TTL).
const DefaultPromptMaxTTL = 24 * time.Hour

// DefaultConfig is the configuration a zero Config stands for, so that
// flags show the real defaults without repeating them.
func DefaultConfig() Config {
	var c Config
	c.setDefaults()
	c.Clock = nil
	return c
}

// Validate reports every setting that cannot work, naming it by its
// environment variable when it has one (MOBILE_JOURNAL_LEASE: …); zero
// values stand for their defaults and are valid.
func (c Config) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"PromptTTL": c.PromptTTL, "PromptMaxTTL": c.PromptMaxTTL,
		"JournalLease": c.JournalLease, "JournalTTL": c.JournalTTL, "CloseGrace": c.CloseGrace, "SweepEvery": c.SweepEvery,
		"HandleTimeout": c.HandleTimeout, "BlobTTL": c.BlobTTL, "RetryFor": c.RetryFor, "OpTimeout": c.OpTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: %v is negative", setting(name), d))
		}
	}
	for name, n := range map[string]int{"SessionQueue": c.SessionQueue, "MaxAttempts": c.MaxAttempts} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s: %d is negative", setting(name), n))
		}
	}
	if c.JournalLease > 0 && c.JournalLease < 3*time.Second {
		errs = append(errs, fmt.Errorf("%s: %v is under 3 s: it is renewed every third of it", setting("JournalLease"), c.JournalLease))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	if c.PromptTTL <= 0 {
		c.PromptTTL = protocol.DefaultPromptTTL
	}
	if c.PromptMaxTTL <= 0 {
		c.PromptMaxTTL = DefaultPromptMaxTTL
	}
	c.PromptMaxTTL = max(c.PromptMaxTTL, c.PromptTTL)
	if c.SessionQueue <= 0 {
		c.SessionQueue = 1000
	}
	if c.JournalLease <= 0 {
		c.JournalLease = 15 * time.Second
	}
	if c.JournalTTL <= 0 {
		c.JournalTTL = 24 * time.Hour
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.CloseGrace <= 0 {
		c.CloseGrace = 10 * time.Second
	}
	c.Clock = clock.Or(c.Clock)
	if c.SweepEvery <= 0 {
		c.SweepEvery = 250 * time.Millisecond
	}
	if c.HandleTimeout <= 0 {
		c.HandleTimeout = 10 * time.Minute
	}
	if c.BlobTTL <= 0 {
		c.BlobTTL = 15 * time.Minute
	}
	if c.RetryFor <= 0 {
		c.RetryFor = 30 * time.Second
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = dispatch.DefaultOpTimeout
	}
}

// Router runs an agent behind the bus.
type Router struct {
	cfg    Config
	log    *slog.Logger
	store  store.Store
	bus    bus.Bus
	agent  agent.Agent
	sender *dispatch.Dispatcher
	tel    routerTelemetry
	outbox *dispatch.Outbox // keeps what a device did not take, and wakes it
	// ownOutbox: New made outbox (Config.Outbox was nil); Close closes it.
	ownOutbox bool

	// id names this router as the holder of journal leases.
	id string

	ctx    context.Context // canceled when Close gives up waiting
	cancel context.CancelFunc
	quit   context.Context // canceled when Close begins: take no more work
	stop   context.CancelFunc
	wg     sync.WaitGroup
	sub    bus.Subscription

	mu      sync.Mutex
	working map[string]*worker // devices whose journal this router works

	// events holds the events taken from the bus and not yet acknowledged,
	// by device (under mu); a goroutine per device with events takes them
	// in arrival order. pendingEvents counts them all.
	events        map[string][]inbound
	pendingEvents int
}

// maxPendingEvents bounds the events a router holds between the bus and
// the store; past it the edge is told to retry (the phone resends).
const maxPendingEvents = 10_000

// inbound is an event taken from the bus, not yet acknowledged.
type inbound struct {
	m  *bus.Msg
	ev wire.Event
}

// queuedEvent is an event taken from a journal, with the span context of
// the message that brought it (empty when untraced).
type queuedEvent struct {
	ev    wire.Event
	trace trace.SpanContext
}

// New returns a router; Start begins taking events.
func New(cfg Config, st store.Store, b bus.Bus, a agent.Agent, log *slog.Logger) *Router {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		cfg: cfg, log: log, store: st, bus: b, agent: a,
		sender:  &dispatch.Dispatcher{Owners: st, Bus: b, Cache: &dispatch.OwnerCache{Clock: cfg.Clock}},
		tel:     newRouterTelemetry(cfg.Telemetry),
		id:      ids.New("r"),
		working: make(map[string]*worker),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.quit, r.stop = context.WithCancel(r.ctx)
	r.outbox = cfg.Outbox
	if r.outbox == nil {
		r.outbox = dispatch.NewOutbox(dispatch.OutboxConfig{OpTimeout: cfg.OpTimeout, Telemetry: cfg.Telemetry}, st, b, log)
		r.ownOutbox = true
	}
	return r
}

// Start subscribes to device events and starts the sweeper of cards and
// journals.
func (r *Router) Start() error {
	sub, err := r.bus.QueueSubscribe(bus.InboundSubject, bus.QueueRouters, r.onEvent)
	if err != nil {
		return err
	}
	r.sub = sub
	r.wg.Go(r.sweep)
	return nil
}

// Close stops taking events and journals, lets the agent calls in progress
// finish for up to CloseGrace (then cancels them), and releases the
// router's journal leases, so other routers continue at once.
func (r *Router) Close() error {
	if r.sub != nil {
		r.sub.Unsubscribe()
	}
	r.mu.Lock()
	r.stop() // under mu: no worker starts after this
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(r.cfg.CloseGrace):
		r.log.Warn("agent calls still running at shutdown; canceling them, their events stay for another router")
	}
	r.cancel()
	<-done
	if r.ownOutbox {
		r.outbox.Close()
	}
	return nil
}

func reply(m *bus.Msg, err error) {
	if m.Respond == nil {
		return
	}
	rep := wire.Reply{OK: err == nil}
	if err != nil {
		rep.Error = err.Error()
	}
	data, _ := wire.Marshal(rep)
	_ = m.Respond(data) // lost with the bus: the edge's request times out
}

var errBusy = errors.New("the agent is busy with this session; retry")

var errOverloaded = errors.New("the router is overloaded; retry")

// onEvent hands one device event to the goroutine that takes its device's
// events (starting one when there is none): the bus's dispatcher does not
// wait for the store, and an event waits only for its own device's
// earlier events, never for another device's.
func (r *Router) onEvent(m *bus.Msg) {
	var ev wire.Event
	if err := wire.Unmarshal(m.Data, &ev); err != nil || ev.Device == "" {
		r.log.Warn("unreadable event", "err", err)
		reply(m, errors.New("unreadable event"))
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.quit.Err() != nil:
		reply(m, errors.New("the router is shutting down; retry"))
		return
	case r.pendingEvents >= maxPendingEvents:
		reply(m, errOverloaded)
		return
	}
	if r.events == nil {
		r.events = make(map[string][]inbound)
	}
	q, busy := r.events[ev.Device]
	r.events[ev.Device] = append(q, inbound{m, ev})
	r.pendingEvents++
	if !busy {
		r.wg.Go(func() { r.takeEvents(ev.Device) })
	}
}

// takeEvents takes device's events, oldest first, until none is left.
func (r *Router) takeEvents(device string) {
	for {
		r.mu.Lock()
		q := r.events[device]
		if len(q) == 0 {
			delete(r.events, device)
			r.mu.Unlock()
			return
		}
		in := q[0]
		q[0] = inbound{}
		r.events[device] = q[1:]
		r.mu.Unlock()
		r.takeEvent(in.m, in.ev)
		r.mu.Lock()
		r.pendingEvents--
		r.mu.Unlock()
	}
}

// takeEvent acknowledges ev once the agent has it (an Acceptor) or it is
// in the device's journal.
func (r *Router) takeEvent(m *bus.Msg, ev wire.Event) {
	tctx, span := r.tel.startEvent(r.ctx, m)
	defer span.End()
	if acc, ok := r.agent.(agent.Acceptor); ok {
		// Durable at once: acknowledged only once the agent has it.
		ctx, cancel := context.WithTimeout(tctx, r.cfg.OpTimeout)
		defer cancel()
		reply(m, acc.Accept(ctx, ev))
		return
	}
	reply(m, r.enqueue(tctx, ev))
}

// sweep takes over the journals whose lease expired (their router died)
// and expires cards: the device gets prompt_done{expired:true} (through its
// outbox if it is away) and the agent gets the outcome, through the
// device's journal.
func (r *Router) sweep() {
	t := time.NewTicker(r.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-r.quit.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.OpTimeout)
		recs, err := r.store.TakeExpired(ctx, r.cfg.Clock.Now(), 256)
		if err != nil {
			r.log.Warn("looking for expired cards failed", "err", err)
		}
		r.takeJournals(ctx)
		for _, rec := range recs {
			safe := protocol.SafeOption(rec.Kind)
			out := &output{r: r, device: rec.Device, hold: true}
			done := wire.PromptDone{ID: rec.ID, OptionID: safe, Expired: true}
			if err := out.send(ctx, wire.Output{Op: wire.OpPromptDone, PromptDone: &done}); err != nil {
				r.log.Warn("sending expiry failed", "device", rec.Device, "err", err)
			}
			ev := wire.Event{Kind: wire.EventPrompt, Session: protocol.Session(rec.Device), Device: rec.Device,
				Prompt: &wire.PromptRef{ID: rec.ID, Kind: rec.Kind, Option: safe, Expired: true}}
			if err := r.enqueue(ctx, ev); err != nil {
				r.log.Warn("telling the agent of an expiry failed", "err", err)
			}
		}
		cancel()
	}
}
