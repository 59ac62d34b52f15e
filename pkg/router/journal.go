package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/internal/retry"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// journalRecord is one journal entry: an event and the span context of the
// message that brought it.
type journalRecord struct {
	Event   wire.Event `json:"ev"`
	TraceID string     `json:"tid,omitempty"`
	SpanID  string     `json:"sid,omitempty"`
	Flags   byte       `json:"tf,omitzero"`
}

// worker is this router working one device's journal. again is set when
// an append found the lease held by this router while the worker may be
// finishing: the worker then reads the journal once more before it stops.
type worker struct {
	again bool
}

// takeJournals sweeps: it leases the journals whose lease expired or was
// released and works them.
func (r *Router) takeJournals(ctx context.Context) {
	devs, err := r.store.TakeJournals(ctx, r.id, r.cfg.JournalLease, 64)
	if err != nil {
		r.log.WarnContext(ctx, "looking for journals to take over failed", "err", err)
	}
	r.tel.m.journalsTakenOver(len(devs))
	for _, d := range devs {
		r.log.Info("took over a device's journal", "device", d)
		r.work(d, nil)
	}
}

// enqueue appends ev to its device's journal and, when this router holds
// the journal's lease, works it. ctx's span becomes the parent of the
// agent's handling. Once enqueue returns nil the event is durable.
func (r *Router) enqueue(ctx context.Context, ev wire.Event) error {
	rec := journalRecord{Event: ev}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		rec.TraceID, rec.SpanID, rec.Flags = sc.TraceID().String(), sc.SpanID().String(), byte(sc.TraceFlags())
	}
	data, err := wire.Marshal(rec)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	lim := store.JournalLimits{MaxLen: r.cfg.SessionQueue, Lease: r.cfg.JournalLease, TTL: r.cfg.JournalTTL}
	a, err := r.store.AppendJournal(actx, ev.Device, r.id, data, lim)
	if errors.Is(err, store.ErrJournalFull) {
		return errBusy
	}
	if err != nil {
		return err
	}
	if a.Leased {
		r.work(ev.Device, a.Head)
	}
	return nil
}

// work makes sure a worker runs device's journal, whose lease this router
// holds. While Close runs it releases the lease instead. head, when known
// (the append that took the lease read it), is what a new worker handles
// first, without reading it again; a worker already running reads on.
func (r *Router) work(device string, head *store.JournalEntry) {
	r.mu.Lock()
	if w := r.working[device]; w != nil {
		w.again = true
		r.mu.Unlock()
		return
	}
	if r.quit.Err() != nil {
		r.mu.Unlock()
		r.release(device, 0)
		return
	}
	w := &worker{}
	r.working[device] = w
	r.tel.m.journalWorked(1)
	r.wg.Go(func() { r.runJournal(device, w, head) })
	r.mu.Unlock()
}

// runJournal handles device's entries in order until the journal is empty
// (which releases the lease), the lease is lost, or Close begins.
func (r *Router) runJournal(device string, w *worker, head *store.JournalEntry) {
	defer r.stopWorker(device, w, true)
	var done int64 // the entry handled last, removed by the next read
	for {
		r.mu.Lock()
		w.again = false
		r.mu.Unlock()
		if r.quit.Err() != nil {
			r.release(device, done)
			return
		}
		var (
			e   store.JournalEntry
			ok  = true
			err error
		)
		if head != nil {
			e, head = *head, nil
		} else {
			e, ok, err = r.next(device, done)
		}
		if err != nil {
			// An append that found the lease ours, or took it (the journal
			// was forgotten: a Redis restart), while next failed asked for
			// another read: it is made from the head, the done entry may
			// be gone with the old journal.
			if r.stopWorker(device, w, false) {
				done = 0
				continue
			}
			if !errors.Is(err, store.ErrLeaseLost) {
				r.log.Warn("reading a journal failed; another router takes it once the lease expires", "device", device, "err", err)
			}
			return
		}
		if !ok {
			if r.stopWorker(device, w, false) {
				done = 0
				continue // an append took the lease again meanwhile
			}
			return
		}
		switch r.handleEntry(device, e) {
		case entryLost:
			return
		case entryInterrupted:
			r.release(device, 0)
			return
		}
		done = e.Seq
	}
}

// stopWorker removes w from the working devices and reports false, unless
// an append asked w to read again (and force is false): then it reports
// true and w stays. One step under mu, so an append either sees w gone and
// starts a new worker, or w sees its request.
func (r *Router) stopWorker(device string, w *worker, force bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.again && !force {
		return true
	}
	if r.working[device] == w {
		delete(r.working, device)
		r.tel.m.journalWorked(-1)
	}
	return false
}

// next reads device's next entry after removing done, retrying while the
// store cannot be reached for up to half the lease, or until the router
// shuts down.
func (r *Router) next(device string, done int64) (store.JournalEntry, bool, error) {
	deadline := time.Now().Add(r.cfg.JournalLease / 2)
	wait := retry.New(100*time.Millisecond, 2*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.cfg.OpTimeout)
		e, ok, err := r.store.NextJournal(ctx, device, r.id, done, r.cfg.JournalLease)
		cancel()
		if err == nil || !errors.Is(err, store.ErrUnavailable) {
			return e, ok, err
		}
		d := wait.Next()
		if time.Now().Add(d).After(deadline) || !retry.Sleep(r.ctx, d) {
			return e, ok, err
		}
	}
}

// release removes done (when not 0) and frees device's lease, leaving the
// rest of the journal to the next router.
func (r *Router) release(device string, done int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.cfg.OpTimeout)
	defer cancel()
	if done != 0 {
		if _, _, err := r.store.NextJournal(ctx, device, r.id, done, r.cfg.JournalLease); err != nil {
			if !errors.Is(err, store.ErrLeaseLost) {
				r.log.Warn("removing a handled event failed; it will be handled again", "device", device, "err", err)
			}
			return
		}
	}
	if err := r.store.ReleaseJournal(ctx, device, r.id); err != nil {
		r.log.Warn("releasing a journal failed; another router takes it once the lease expires", "device", device, "err", err)
	}
}

// Outcomes of handleEntry.
const (
	entryHandled     = iota // the agent call returned: the entry is done
	entryLost               // the lease was lost meanwhile: the new holder handles it again
	entryInterrupted        // Close canceled the call: the entry stays for another router
)

// handleEntry runs the agent for e, or drops e when its routers died on it
// MaxAttempts times, renewing the lease meanwhile. A lost
// lease cancels the call, and so does a lease that could not be renewed for
// its whole length (the store is out of reach: another router may have
// taken the journal).
func (r *Router) handleEntry(device string, e store.JournalEntry) int {
	var rec journalRecord
	if err := wire.Unmarshal(e.Data, &rec); err != nil {
		r.log.Error("dropping an unreadable journal entry", "device", device, "err", err)
		return entryHandled
	}
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	var lost atomic.Bool
	stop := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		t := time.NewTicker(r.cfg.JournalLease / 3)
		defer t.Stop()
		renewed := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
			err := r.store.RenewJournal(rctx, device, r.id, r.cfg.JournalLease)
			rcancel()
			if err == nil {
				renewed = time.Now()
			}
			if errors.Is(err, store.ErrLeaseLost) || time.Since(renewed) >= r.cfg.JournalLease {
				// Another router may be handling the journal now.
				r.log.Warn("lost a journal's lease during an agent call; canceling it", "device", device, "err", err)
				lost.Store(true)
				cancel()
				return
			}
			if err != nil && ctx.Err() == nil {
				r.log.Warn("renewing a journal's lease failed", "device", device, "err", err)
			}
		}
	})
	if e.Takeovers >= r.cfg.MaxAttempts {
		r.drop(ctx, rec.Event)
	} else {
		if e.Takeovers > 0 {
			r.log.Warn("handling an event again: its router died on it", "device", device, "kind", rec.Event.Kind, "takeovers", e.Takeovers)
		}
		r.handle(ctx, queuedEvent{ev: rec.Event, trace: rec.spanContext()})
	}
	close(stop)
	renewing.Wait()
	switch {
	case lost.Load():
		return entryLost
	case r.ctx.Err() != nil:
		return entryInterrupted
	}
	return entryHandled
}

// drop gives up on ev, the oldest event of a journal that was taken over
// from dead routers MaxAttempts times: the agent call on it is the likely
// cause of their deaths (a huge input, a crash no recover catches), so the
// agent does not get it again. The phone is told, through the outbox if it
// is offline, and its avatar ends idle.
func (r *Router) drop(ctx context.Context, ev wire.Event) {
	r.log.Error("dropping an event: its routers died on it too often", "device", ev.Device, "kind", ev.Kind, "attempts", r.cfg.MaxAttempts)
	r.tel.m.journalDropped()
	out := &output{r: r, device: ev.Device, via: ev.Edge, hold: true, share: shareFor(ev)}
	text := fmt.Sprintf("This message could not be handled (the agent failed on it %d times) and was dropped.", r.cfg.MaxAttempts)
	if err := out.Message(ctx, ids.New("m"), text, false, true); err != nil {
		r.log.Warn("telling the phone of a dropped event failed", "device", ev.Device, "err", err)
	}
	_ = out.Typing(ctx, true) // if lost, the edge idles a silent avatar after 30 s
}

// spanContext is the span context rec carries (empty when untraced): the
// agent's handling is a child of the span that took the event.
func (rec journalRecord) spanContext() trace.SpanContext {
	tid, err1 := trace.TraceIDFromHex(rec.TraceID)
	sid, err2 := trace.SpanIDFromHex(rec.SpanID)
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(rec.Flags),
	})
}

// handle runs the agent for one event under ctx.
func (r *Router) handle(ctx context.Context, qe queuedEvent) {
	ev := qe.ev
	ctx, cancel := context.WithTimeout(ctx, r.cfg.HandleTimeout)
	defer cancel()
	ctx, span := r.tel.start(withParent(ctx, qe.trace), "agent.handle", ev.Kind)
	defer span.End()
	// The answer starts from the socket the event came through: no owner
	// read for its typing state and first message (the edge fences it).
	r.sender.Cache.Seed(ev.Device, store.Owner{Edge: ev.Edge, Epoch: ev.Epoch})
	out := &output{r: r, device: ev.Device, via: ev.Edge, hold: true, share: shareFor(ev)}
	defer func() {
		if p := recover(); p != nil {
			r.log.ErrorContext(ctx, "agent panicked", "device", ev.Device, "panic", p)
		}
	}()
	if err := r.agent.Handle(ctx, ev, out); err != nil {
		r.log.WarnContext(ctx, "agent failed", "device", ev.Device, "kind", ev.Kind, "err", err)
		span.RecordError(err)
		// Never leave the avatar hanging (if this is lost, the edge idles a
		// silent avatar after 30 s).
		_ = out.Typing(ctx, true)
	}
}
