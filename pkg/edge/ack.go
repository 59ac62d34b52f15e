package edge

import (
	"errors"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// maxUnacked bounds the deliveries a connection keeps waiting for the
// phone's ack; past it a delivery is answered as written, without waiting.
const maxUnacked = 256

// recentAcks is how many acks of ids nobody waited for yet a connection
// remembers: the phone may ack a message before the edge has finished
// checking the write (see fenceOwner).
const recentAcks = 64

// acksTTL is how long the store remembers that a device acks, from the
// first ack of its latest socket: a new socket of the device waits for
// acks from its first frame (the outbox flush included) while the record
// lives. It is the journal's 24 h, a day of a phone's life: longer than
// any outbox item (10 min) and any ordinary gap between sockets, short
// enough that a device id taken over by a client that never acks stops
// waiting AckWait for each delivery a day after the last ack.
const acksTTL = 24 * time.Hour

// recentAckBytes bounds the ids of those acks by their size: 64 ids of
// 128 ASCII characters. Past either bound the oldest is forgotten, so a
// connection holds at most this much of its phone's early acks.
const recentAckBytes = recentAcks * protocol.MaxIDChars

// ackable reports whether the phone acknowledges out once it displayed it:
// the final frame of a message, the last chunk of a file. (Earlier edits
// of a message are superseded by its final text.)
func ackable(out wire.Output) bool {
	return out.ID != "" && (out.Op == wire.OpMessage && out.Final || out.Op == wire.OpMedia)
}

// errNotAcked: the phone acknowledges what it displays, and did not
// acknowledge this delivery before its socket closed or AckWait passed.
var errNotAcked = errors.New("written, but the phone did not acknowledge it")

// ackWaiter is a delivery written to the socket that waits for the
// phone's ack of its id.
type ackWaiter struct {
	done  func(acked bool, err error)
	timer *time.Timer
}

// awaitAck wraps done (called once the delivery out is written and fenced)
// so that, on a connection whose phone acknowledges what it displays (it
// has sent an ack on this socket, or the store remembers one on an earlier
// socket) or for an output that asks for it (WaitAck), the answer
// waits for the phone's ack of out.ID, for at most AckWait:
//
//   - acked: done(true, nil);
//   - not acked in time, or the socket closed first, on a phone that acks:
//     done(false, errNotAcked), and the sender keeps the output (the
//     router's outbox) as not delivered;
//   - not acked by a phone not known to ack: done(false, nil), written
//     as before.
//
// A phone that never acks is answered once the frames are written, as the
// protocol's reference does.
func (c *conn) awaitAck(out wire.Output, done func(acked bool, err error)) func(error) {
	return func(err error) {
		if err != nil || !ackable(out) {
			done(false, err)
			return
		}
		c.mu.Lock()
		if c.ackedLocked(out.ID) {
			c.mu.Unlock()
			done(true, nil)
			return
		}
		if !c.flags.is(flagAcking) && !out.WaitAck || c.flags.is(flagClosed) || len(c.unackedIDs) >= maxUnacked && c.unacked[out.ID] == nil {
			unacked := c.flags.is(flagAcking) && c.flags.is(flagClosed) // a phone that acks lost the socket first
			c.mu.Unlock()
			if unacked {
				c.srv.tel.m.deliveryUnacked()
				done(false, errNotAcked)
				return
			}
			done(false, nil)
			return
		}
		w := &ackWaiter{done: done}
		if c.unacked == nil {
			c.unacked = make(map[string][]*ackWaiter)
		}
		if c.unacked[out.ID] == nil {
			c.unackedIDs = append(c.unackedIDs, out.ID)
		}
		c.unacked[out.ID] = append(c.unacked[out.ID], w)
		w.timer = time.AfterFunc(c.srv.cfg.AckWait, func() { c.ackExpired(out.ID, w) })
		c.mu.Unlock()
	}
}

// onAck: the phone displayed (or played) the message id. Every delivery
// of id written so far (a message and its edits) is acknowledged.
func (c *conn) onAck(id string) {
	c.mu.Lock()
	first := !c.flags.is(flagAcked)
	c.flags.set(flagAcking | flagAcked)
	ws := c.takeUnackedLocked(id)
	if ws == nil {
		// Early (its delivery is still being checked) or not ours to
		// wait for: remember it for a while.
		if c.recentAcks == nil {
			c.recentAcks = make([]string, 0, recentAcks)
		}
		size := len(id)
		for _, x := range c.recentAcks {
			size += len(x)
		}
		for len(c.recentAcks) > 0 && (len(c.recentAcks) == recentAcks || size > recentAckBytes) {
			size -= len(c.recentAcks[0])
			c.recentAcks = append(c.recentAcks[:0], c.recentAcks[1:]...)
		}
		if size <= recentAckBytes {
			c.recentAcks = append(c.recentAcks, id)
		}
	}
	c.mu.Unlock()
	if first {
		c.srv.goFunc(c.rememberAcks)
	}
	for _, w := range ws {
		if w.timer.Stop() {
			w.done(true, nil)
		}
	}
}

// rememberAcks tells the store, once per socket, that the device acks, so
// its next socket waits for acks from its first frame (see hello).
func (c *conn) rememberAcks() {
	ctx, cancel := c.compensationContext()
	defer cancel()
	if err := c.srv.store.SetDeviceAcks(ctx, c.device, acksTTL); err != nil {
		c.logger().Warn("recording that the device acks failed; its next socket learns it from its first ack", "err", err)
	}
}

// ackedLocked reports whether the phone acked id before anybody waited for
// it, and forgets that ack.
func (c *session) ackedLocked(id string) bool {
	for i, x := range c.recentAcks {
		if x == id {
			c.recentAcks = append(c.recentAcks[:i], c.recentAcks[i+1:]...)
			return true
		}
	}
	return false
}

// ackExpired answers w, still unacknowledged after AckWait.
func (c *conn) ackExpired(id string, w *ackWaiter) {
	c.mu.Lock()
	ws := c.unacked[id]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		c.takeUnackedLocked(id)
	} else {
		c.unacked[id] = ws
	}
	acking := c.flags.is(flagAcking)
	c.mu.Unlock()
	c.notAcked(acking, w)
}

// notAcked answers w, which the phone did not ack: not delivered when the
// phone acks, written as before when it never did.
func (c *conn) notAcked(acking bool, w *ackWaiter) {
	if !acking {
		w.done(false, nil)
		return
	}
	c.srv.tel.m.deliveryUnacked()
	w.done(false, errNotAcked)
}

// takeUnackedLocked removes and returns the waiters of id.
func (c *session) takeUnackedLocked(id string) []*ackWaiter {
	ws, ok := c.unacked[id]
	if !ok {
		return nil
	}
	delete(c.unacked, id)
	for i, x := range c.unackedIDs {
		if x == id {
			c.unackedIDs = append(c.unackedIDs[:i:i], c.unackedIDs[i+1:]...)
			break
		}
	}
	return ws
}

// failUnacked answers every delivery still waiting for an ack, in the
// order they were written, when the socket closes: the phone may not have
// them. Called by teardown.
func (c *conn) failUnacked() {
	c.mu.Lock()
	ids := c.unackedIDs
	unacked := c.unacked
	c.unackedIDs, c.unacked = nil, nil
	acking := c.flags.is(flagAcking)
	c.mu.Unlock()
	for _, id := range ids {
		for _, w := range unacked[id] {
			if !w.timer.Stop() {
				continue // ackExpired answers it
			}
			c.notAcked(acking, w)
		}
	}
}
