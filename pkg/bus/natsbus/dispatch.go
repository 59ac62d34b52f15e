package natsbus

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermes-mobile/gateway/pkg/bus"
)

// shard is one dispatcher: the channel nats.go fills for the subscriptions
// whose subject hashes to it, and their Handlers. One goroutine (run) reads
// the channel.
//
// Lock order: shard.mu, then nats.go's connection lock (Subscribe holds mu
// across ChanSubscribe). The dispatcher holds mu only for a map lookup,
// never while a Handler runs.
type shard struct {
	ch chan *nats.Msg // filled by nats.go's reader, drained by run

	mu   sync.RWMutex
	subs map[*nats.Subscription]*handler // subscriptions of this shard, live or draining
}

// handler is a subscription's Handler; late is set once its Unsubscribe
// began (the messages it still gets are bus.Msg.Late).
type handler struct {
	h    bus.Handler
	late atomic.Bool
}

// unsubscribed is the Subject of the marker a drained subscription sends
// through its shard's channel behind its last message: the dispatcher then
// forgets its Handler. No NATS subject can be empty.
const unsubscribed = ""

func newShards(n, pending int) []*shard {
	if n <= 0 {
		n = defaultDispatchers()
	}
	if pending <= 0 {
		pending = DefaultPending
	}
	per := max(pending/n, minPerDispatcher)
	shards := make([]*shard, n)
	for i := range shards {
		shards[i] = &shard{
			ch:   make(chan *nats.Msg, per),
			subs: make(map[*nats.Subscription]*handler),
		}
	}
	return shards
}

// start runs one dispatcher per shard; Close waits for them through b.wg.
func (b *Bus) start() {
	for _, sh := range b.shards {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.run(sh)
		}()
	}
}

// shardFor picks the shard of subject with FNV-1a.
func (b *Bus) shardFor(subject string) *shard {
	h := uint32(2166136261)
	for i := 0; i < len(subject); i++ {
		h ^= uint32(subject[i])
		h *= 16777619
	}
	return b.shards[h%uint32(len(b.shards))]
}

func (b *Bus) run(sh *shard) {
	for {
		select {
		case <-b.quit:
			return
		case m := <-sh.ch:
			if m.Subject == unsubscribed {
				sh.mu.Lock()
				delete(sh.subs, m.Sub)
				sh.mu.Unlock()
				continue
			}
			sh.mu.RLock()
			h := sh.subs[m.Sub]
			sh.mu.RUnlock()
			if h != nil { // nil: unsubscribed at once (the connection was down)
				b.handle(h, m)
			}
		}
	}
}

func (b *Bus) handle(h *handler, m *nats.Msg) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("bus handler panicked", "subject", m.Subject, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	h.h(&bus.Msg{
		Subject: strings.TrimPrefix(m.Subject, b.prefix),
		Data:    m.Data,
		Header:  fromNATSHeader(m.Header),
		Respond: b.responder(m.Reply),
		Late:    h.late.Load(),
	})
}

func (b *Bus) responder(reply string) func([]byte) error {
	if reply == "" {
		return noRespond
	}
	return func(data []byte) error {
		if err := b.nc.Publish(reply, data); err != nil {
			return opErr("respond", reply, err)
		}
		return nil
	}
}

func noRespond([]byte) error { return nil }

func (b *Bus) subscribe(subject, queue string, h bus.Handler) (bus.Subscription, error) {
	if h == nil {
		return nil, fmt.Errorf("natsbus: subscribe %s: nil handler", subject)
	}
	if err := b.checkSubject(subject); err != nil {
		return nil, err
	}
	sh := b.shardFor(subject)
	sh.mu.Lock()
	var ns *nats.Subscription
	var err error
	if queue == "" {
		ns, err = b.nc.ChanSubscribe(b.prefix+subject, sh.ch)
	} else {
		ns, err = b.nc.ChanQueueSubscribe(b.prefix+subject, queue, sh.ch)
	}
	if err != nil {
		sh.mu.Unlock()
		return nil, opErr("subscribe", subject, err)
	}
	sh.subs[ns] = &handler{h: h}
	sh.mu.Unlock()
	// Return once the server has the interest: a caller that subscribes and
	// then tells others it listens (an edge sending ready) must be reachable.
	// While disconnected the subscription is sent on reconnect instead. The
	// round trip is shared by the subscriptions made meanwhile (a PING sent
	// after their SUBs, whose PONG confirms them all).
	if err := b.flushes.Do(struct{}{}); err != nil {
		b.log.Debug("subscription not confirmed by the server yet", "subject", subject, "err", err)
	}
	return &subscription{b: b, sh: sh, ns: ns}, nil
}

// flushWait bounds the round trip that confirms a new subscription.
const flushWait = 2 * time.Second

// subscription is the bus.Subscription of a Bus.
type subscription struct {
	b    *Bus
	sh   *shard
	ns   *nats.Subscription
	once sync.Once
}

// Unsubscribe drains the subscription (nats.go's Drain): it tells the
// server to stop routing to it, and the messages the server routed before
// it heard of that are still handled, marked Late; once a round trip to the
// server proved nothing more comes (at most flushWait), the Handler is
// forgotten. So a request that reached this process is answered by its
// Handler instead of being dropped unseen while its sender waits out a
// timeout. Unsubscribe does not wait for the round trip. While the
// connection is down nothing can be routed to it: the Handler is removed
// at once. Idempotent, and nil after the Bus is closed.
func (s *subscription) Unsubscribe() error {
	var err error
	s.once.Do(func() { err = s.drain() })
	return err
}

func (s *subscription) drain() error {
	s.sh.mu.RLock()
	h := s.sh.subs[s.ns]
	s.sh.mu.RUnlock()
	if h == nil {
		return nil
	}
	h.late.Store(true)
	closed := s.ns.StatusChanged(nats.SubscriptionClosed)
	if !s.b.nc.IsConnected() || s.ns.Drain() != nil {
		return s.removeNow()
	}
	go func() {
		select {
		case <-closed: // after the round trip: every message routed to it is in sh.ch
		case <-time.After(flushWait):
			s.b.log.Debug("unsubscribe not confirmed by the server yet", "subject", s.ns.Subject)
		case <-s.b.quit:
			return
		}
		// The marker goes behind the subscription's last message.
		select {
		case s.sh.ch <- &nats.Msg{Sub: s.ns, Subject: unsubscribed}:
		case <-s.b.quit:
		}
	}()
	return nil
}

// removeNow forgets the Handler, so messages still queued are dropped, and
// ends the interest on the server.
func (s *subscription) removeNow() error {
	s.sh.mu.Lock()
	delete(s.sh.subs, s.ns)
	s.sh.mu.Unlock()
	err := s.ns.Unsubscribe()
	if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		return nil
	}
	return opErr("unsubscribe", s.ns.Subject, err)
}
