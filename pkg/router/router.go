// Package router is the agent side of the gateway. It takes device events
// from the bus (one router of the queue group gets each), runs the agent for
// them one session at a time, delivers the agent's output to the edge that
// owns the device (or to the device's outbox while it is offline), and
// expires prompt cards.
package router

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Config of a router. Zero values take the defaults.
type Config struct {
	// PromptTTL is a card's lifetime (MOBILE_PROMPT_TTL, 300 s).
	PromptTTL time.Duration
	// OutboxMax bounds the frames kept for an offline device (256); the
	// oldest are dropped first.
	OutboxMax int
	// OutboxTTL is how long they are kept (10 min).
	OutboxTTL time.Duration
	// SessionQueue bounds the events waiting for the agent per session
	// (1000); past it new events are refused and the phone retries.
	SessionQueue int
	// SweepEvery is how often expired cards are looked for (250 ms).
	SweepEvery time.Duration
	// HandleTimeout bounds one agent call (10 min).
	HandleTimeout time.Duration
	// BlobTTL is how long media the agent sends is kept for delivery (15 min).
	BlobTTL time.Duration
	// RetryFor is how long a delivery is retried while the bus or the store
	// fails before the output goes to the outbox (30 s).
	RetryFor time.Duration
	// Telemetry receives the router's metrics and spans; nil records nothing.
	Telemetry *telemetry.Telemetry
}

func (c *Config) setDefaults() {
	if c.PromptTTL <= 0 {
		c.PromptTTL = protocol.DefaultPromptTTL
	}
	if c.OutboxMax <= 0 {
		c.OutboxMax = 256
	}
	if c.OutboxTTL <= 0 {
		c.OutboxTTL = 10 * time.Minute
	}
	if c.SessionQueue <= 0 {
		c.SessionQueue = 1000
	}
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

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sub    bus.Subscription

	mu       sync.Mutex
	sessions map[string]*sessionQueue
}

// sessionQueue runs one session's events in order.
type sessionQueue struct {
	events  []queuedEvent
	running bool
}

// queuedEvent is an event waiting for the agent, with the span context of
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
		sender:   &dispatch.Dispatcher{Owners: st, Bus: b},
		tel:      newRouterTelemetry(cfg.Telemetry),
		sessions: make(map[string]*sessionQueue),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// Start subscribes to device events and starts the prompt sweeper.
func (r *Router) Start() error {
	sub, err := r.bus.QueueSubscribe(bus.InboundSubject, bus.QueueRouters, r.onEvent)
	if err != nil {
		return err
	}
	r.sub = sub
	r.wg.Go(r.sweep)
	return nil
}

// Close stops taking events and waits for running agent calls to end.
func (r *Router) Close() error {
	if r.sub != nil {
		r.sub.Unsubscribe()
	}
	r.cancel()
	r.wg.Wait()
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
	data, _ := json.Marshal(rep)
	m.Respond(data)
}

var errBusy = errors.New("the agent is busy with this session; retry")

// onEvent takes one device event: it is acknowledged once queued.
func (r *Router) onEvent(m *bus.Msg) {
	tctx, span := r.tel.startEvent(r.ctx, m)
	defer span.End()
	var ev wire.Event
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Device == "" {
		r.log.Warn("unreadable event", "err", err)
		reply(m, errors.New("unreadable event"))
		return
	}
	if acc, ok := r.agent.(agent.Acceptor); ok {
		// Durable at once: acknowledged only once the agent has it.
		ctx, cancel := context.WithTimeout(tctx, 5*time.Second)
		defer cancel()
		reply(m, acc.Accept(ctx, ev))
		return
	}
	reply(m, r.enqueue(tctx, ev))
}

// enqueue queues ev for its session; ctx's span becomes the parent of the
// agent's handling.
func (r *Router) enqueue(ctx context.Context, ev wire.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return errors.New("router shutting down")
	}
	q := r.sessions[ev.Device]
	if q == nil {
		q = &sessionQueue{}
		r.sessions[ev.Device] = q
	}
	if len(q.events) >= r.cfg.SessionQueue {
		return errBusy
	}
	q.events = append(q.events, queuedEvent{ev, trace.SpanContextFromContext(ctx)})
	if !q.running {
		q.running = true
		r.wg.Go(func() { r.run(ev.Device, q) })
	}
	return nil
}

// run drains one session's queue.
func (r *Router) run(device string, q *sessionQueue) {
	for {
		r.mu.Lock()
		if len(q.events) == 0 || r.ctx.Err() != nil {
			q.running = false
			delete(r.sessions, device)
			r.mu.Unlock()
			return
		}
		qe := q.events[0]
		q.events = q.events[1:]
		r.mu.Unlock()
		r.handle(qe)
	}
}

func (r *Router) handle(qe queuedEvent) {
	ev := qe.ev
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.HandleTimeout)
	defer cancel()
	ctx, span := r.tel.start(withParent(ctx, qe.trace), "agent.handle", ev.Kind)
	defer span.End()
	out := &output{r: r, device: ev.Device}
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("agent panicked", "device", ev.Device, "panic", p)
		}
	}()
	if err := r.agent.Handle(ctx, ev, out); err != nil {
		r.log.Warn("agent failed", "device", ev.Device, "kind", ev.Kind, "err", err)
		span.RecordError(err)
		// Never leave the avatar hanging.
		out.Typing(ctx, true)
	}
}

// sweep expires cards: the device gets prompt_done{expired:true} (through
// its outbox if it is away) and the agent gets the outcome.
func (r *Router) sweep() {
	t := time.NewTicker(r.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		recs, err := r.store.TakeExpired(ctx, time.Now(), 256)
		if err != nil {
			r.log.Warn("looking for expired cards failed", "err", err)
		}
		for _, rec := range recs {
			safe := protocol.SafeOption(rec.Kind)
			out := &output{r: r, device: rec.Device}
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
