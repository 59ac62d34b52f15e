package edge

import (
	"errors"
	"math"
	"sync"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// writeOutbox writes the device's outbox items that this socket has not
// queued yet. The items stay in the store until they are delivered, by the
// rule of live deliveries (awaitAck): written, and for a phone that acks,
// acked. An outboxAck removes them once the socket reports them delivered,
// so a socket (or an edge) that dies mid-flush, or a phone that drops them
// unread, leaves them to the device's next connection. Reads of one socket
// run one at a time, in order.
//
// While more than half of MaxOutboundBytes is queued, the next item waits
// for the one before it to be written, so an outbox larger than the queue
// reaches a phone that reads, instead of closing its socket as a slow
// reader at every connection.
func (c *conn) writeOutbox() {
	c.outboxMu.Lock()
	defer c.outboxMu.Unlock()
	ctx, cancel := c.opContext()
	items, err := c.srv.store.PeekOutbox(ctx, c.device, c.outboxSent)
	cancel()
	if err != nil {
		c.logger().Warn("reading outbox failed", "err", err)
		return
	}
	if len(items) == 0 {
		return
	}
	a := &outboxAck{c: c, bad: math.MaxInt64}
	c.outboxAckMu.Lock()
	c.outboxReads = append(c.outboxReads, a)
	c.outboxAckMu.Unlock()
	var prev <-chan struct{}
	for _, it := range items {
		if prev != nil && c.queuedBytes() > c.srv.cfg.MaxOutboundBytes/2 {
			<-prev // runs once the item is written or its socket is gone
		}
		delivered, written := a.queue(it.Seq)
		var out wire.Output
		switch err := wire.Unmarshal(it.Data, &out); {
		case err != nil:
			c.logger().Warn("dropping unreadable outbox item", "err", err)
			c.setAvatar("", wrote(written, delivered)) // removed in its turn, after the items before it
		case wire.IsControl(out.Op):
			c.setAvatar("", wrote(written, delivered)) // not output: nothing to write
		default:
			acked := c.awaitAck(out, func(_ bool, err error) { delivered(err) })
			ctx, cancel := c.opContext() // a file is fetched in render
			c.render(ctx, out, wrote(written, acked))
			cancel()
		}
		if a.failed() {
			// Not written (the socket broke, or a file could not be
			// fetched): this socket leaves it and the rest, a later read
			// or the next connection tries again.
			break
		}
		c.outboxSent, prev = it.Seq, written
	}
	a.queued()
}

// queuedBytes reports the bytes queued for the socket and not yet written.
func (c *conn) queuedBytes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outBytes
}

// outboxAck acknowledges the items of one outbox read once the socket has
// delivered them (written them, and for a phone that acks, had them acked):
// up to the last item before the first that was not delivered. Items
// are written in order and a socket whose write fails is closed, so when
// the acknowledgement runs, every item queued before on this socket has
// been written too. The acknowledgement carries the socket's epoch: once a
// newer connection of the device has claimed it, this socket removes
// nothing, and the newer one reads the items again.
type outboxAck struct {
	c *conn

	mu      sync.Mutex
	seqs    []int64 // queued, in order
	pending int     // queued items whose delivered has not run
	bad     int64   // the lowest Seq not delivered (MaxInt64: none)
	broken  bool    // an item was not written (not merely not acked)
	all     bool    // every item is queued
	settled bool    // every item is queued and done
}

// queue adds the item seq. It returns the delivered that reports whether
// it was delivered, and a channel for wrote to close once it was written
// (or failed), which for a phone that acks comes before its ack.
func (a *outboxAck) queue(seq int64) (delivered func(error), written chan struct{}) {
	a.mu.Lock()
	a.seqs = append(a.seqs, seq)
	a.pending++
	a.mu.Unlock()
	return func(err error) {
		a.mu.Lock()
		a.pending--
		// A file whose bytes are gone fails at every connection: it is
		// dropped like a written item, as the router drops it.
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			a.bad = min(a.bad, seq)
			// A phone that acks and is slow to: the rest is written all
			// the same (a closed socket fails the next write).
			a.broken = a.broken || !errors.Is(err, errNotAcked)
		}
		after := a.settleLocked()
		a.mu.Unlock()
		run(after)
	}, make(chan struct{})
}

// wrote returns the done of an item's write: it closes written, then
// passes the outcome on to then.
func wrote(written chan struct{}, then func(error)) func(error) {
	return func(err error) {
		close(written)
		then(err)
	}
}

// failed reports whether an item could not be written.
func (a *outboxAck) failed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.broken
}

// queued marks the end of the read.
func (a *outboxAck) queued() {
	a.mu.Lock()
	a.all = true
	after := a.settleLocked()
	a.mu.Unlock()
	run(after)
}

// settleLocked returns the acknowledgement to run, once every item is
// queued and done (nil before); a.mu is held before and after.
func (a *outboxAck) settleLocked() (after func()) {
	if !a.all || a.pending > 0 {
		return nil
	}
	a.all = false // once
	a.settled = true
	return a.c.settleReads
}

// settleReads acknowledges the settled reads of this socket in read order,
// each up to the last of its items before the first item this socket did
// not deliver, in that read or an earlier one. Removing up to a Seq
// removes every item before it: a reread whose items were written while
// the flush before it still waited for the phone's acks must not take the
// flush's items with it (a phone whose network died would lose them).
func (c *session) settleReads() {
	type ack struct {
		a       *outboxAck
		written int
		upTo    int64
	}
	var acks []ack
	c.outboxAckMu.Lock()
	for len(c.outboxReads) > 0 {
		a := c.outboxReads[0]
		a.mu.Lock()
		settled, bad, seqs := a.settled, a.bad, a.seqs
		a.mu.Unlock()
		if !settled {
			break
		}
		c.outboxReads = c.outboxReads[1:]
		if c.outboxBad == 0 || bad < c.outboxBad {
			c.outboxBad = bad
		}
		written := 0
		for written < len(seqs) && seqs[written] < c.outboxBad {
			written++
		}
		var upTo int64
		if written > 0 {
			upTo = seqs[written-1]
		}
		acks = append(acks, ack{a, written, upTo})
	}
	c.outboxAckMu.Unlock()
	for _, x := range acks {
		x.a.acknowledge(x.written, x.upTo)
	}
}

// acknowledge removes the written items of the read, up to the Seq upTo,
// from the outbox.
func (a *outboxAck) acknowledge(written int, upTo int64) {
	c := a.c
	c.srv.tel.m.outboxDelivered(written)
	if written == 0 {
		return
	}
	c.srv.goFunc(func() {
		ctx, cancel := c.compensationContext()
		defer cancel()
		ok, err := c.srv.store.AckOutbox(ctx, c.device, c.epoch.Load(), upTo)
		switch {
		case err != nil:
			c.logger().Warn("acknowledging outbox items failed; the device gets them again", "err", err)
		case !ok:
			c.logger().Debug("outbox items left to the device's newer connection", "up_to", upTo)
		}
	})
}

// rereadOutbox answers OpOutbox: the router filed output in the outbox that
// may have come after this socket's flush. Before ready the flush is still
// to come, or running: the request waits with the held deliveries. A
// closing socket leaves the outbox to the device's next connection.
func (c *conn) rereadOutbox() {
	c.mu.Lock()
	switch {
	case c.flags.is(flagClosing | flagClosed):
		c.mu.Unlock()
	case !c.flags.is(flagReady):
		c.held = append(c.held, heldItem{done: func(error) {}, reread: true})
		c.mu.Unlock()
	default:
		c.mu.Unlock()
		c.srv.goFunc(c.writeOutbox)
	}
}
