package natsbus

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
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
	subs map[*nats.Subscription]bus.Handler // live subscriptions of this shard
}

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
			subs: make(map[*nats.Subscription]bus.Handler),
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
			sh.mu.RLock()
			h := sh.subs[m.Sub]
			sh.mu.RUnlock()
			if h != nil { // nil: unsubscribed while the message was queued
				b.handle(h, m)
			}
		}
	}
}

func (b *Bus) handle(h bus.Handler, m *nats.Msg) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("bus handler panicked", "subject", m.Subject, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	h(&bus.Msg{
		Subject: strings.TrimPrefix(m.Subject, b.prefix),
		Data:    m.Data,
		Header:  fromNATSHeader(m.Header),
		Respond: b.responder(m.Reply),
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
	sh.subs[ns] = h
	sh.mu.Unlock()
	// Return once the server has the interest: a caller that subscribes and
	// then tells others it listens (an edge sending ready) must be reachable.
	// While disconnected the subscription is sent on reconnect instead.
	if err := b.nc.FlushTimeout(flushWait); err != nil {
		b.log.Debug("subscription not confirmed by the server yet", "subject", subject, "err", err)
	}
	return &subscription{sh: sh, ns: ns}, nil
}

// flushWait bounds the round trip that confirms a new subscription.
const flushWait = 2 * time.Second

// subscription is the bus.Subscription of a Bus.
type subscription struct {
	sh *shard
	ns *nats.Subscription
}

// Unsubscribe removes the Handler, so messages still queued are dropped,
// then ends the interest on the server. It is idempotent, and nil after the
// Bus is closed.
func (s *subscription) Unsubscribe() error {
	s.sh.mu.Lock()
	_, live := s.sh.subs[s.ns]
	delete(s.sh.subs, s.ns)
	s.sh.mu.Unlock()
	if !live {
		return nil
	}
	err := s.ns.Unsubscribe()
	if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		return nil
	}
	return opErr("unsubscribe", s.ns.Subject, err)
}
