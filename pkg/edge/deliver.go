package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/usage"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// heldItem is a delivery that arrived before the outbox was flushed, or
// (reread) a request to read the outbox again once it was.
type heldItem struct {
	out    wire.Output
	done   func(error)
	reread bool
}

// onControl handles a Control message about a device held here. One about
// a device with no socket here is kept for a moment (early): a hello may
// be between its claim and its registration, and the notice is about it.
func (s *Server) onControl(ctl wire.Control) {
	s.mu.Lock()
	var c *conn
	if slot := s.devices[ctl.Device]; slot != nil {
		c = slot.conn
	}
	if c == nil {
		s.noteEarlyLocked(ctl)
	}
	s.mu.Unlock()
	if c == nil {
		return
	}
	switch ctl.Op {
	case wire.OpTakeover:
		if c.epoch.Load() < ctl.Epoch {
			c.replacedByNewer()
		}
	case wire.OpOutbox:
		c.rereadOutbox()
	}
}

// onEdgeDelivery handles a message on this edge's output subject: an
// output or a control for a device whose owner record names this edge.
// Nobody else gets it, so a request is always answered: once the frames
// are written, or at once with what became of the device
// (answerNoSocket).
func (s *Server) onEdgeDelivery(m *bus.Msg) { s.onDelivery(m, true) }

// onDeviceDelivery handles a message on a device subject (senders and
// edges of a release before edge subjects; Config.DeviceSubjects). Every
// edge that holds or held the device may get it: it answers only when
// this edge holds the device at the output's epoch, once the frames are
// written, or held it at that epoch a moment ago (answerNoSocket);
// otherwise it stays silent so the current owner's answer counts.
//
// shim(v0.2.0): Config.DeviceSubjects.
func (s *Server) onDeviceDelivery(m *bus.Msg) { s.onDelivery(m, false) }

func (s *Server) onDelivery(m *bus.Msg, direct bool) {
	var out wire.Output
	if err := wire.Unmarshal(m.Data, &out); err != nil {
		s.log.Warn("unreadable delivery", "subject", m.Subject, "err", err)
		return
	}
	if wire.IsControl(out.Op) {
		s.onControl(wire.Control{Op: out.Op, Device: out.Device, Epoch: out.Epoch})
		return
	}
	c := s.deviceConn(out.Device)
	if m.Late && m.Respond == nil {
		return // sent to a socket that closed; nobody waits for it
	}
	if direct && m.Respond != nil && (c == nil || out.Epoch != 0 && c.epoch.Load() < out.Epoch) {
		// No socket here at the output's epoch: it closed, or the newer
		// socket the sender read the owner of is not registered yet.
		s.goFunc(func() { s.answerNoSocket(m, out, true) })
		return
	}
	if !direct && (c == nil && out.Epoch != 0 || m.Late) && m.Respond != nil {
		// No socket here, yet this edge was subscribed when the request
		// was sent: the socket closed a moment ago (Late: its subscription
		// was being drained, whatever socket is here now). An edge that
		// took the device over since may have subscribed too late to get
		// it, so nobody else may answer: say what became of the device
		// rather than let the sender wait out its timeout.
		s.goFunc(func() { s.answerNoSocket(m, out, false) })
		return
	}
	if c == nil || out.Epoch != 0 && c.epoch.Load() < out.Epoch {
		return // not ours (any more): the owner answers; or a moment nobody waits for
	}
	if out.Epoch != 0 && (c.epoch.Load() > out.Epoch || c.isClosing()) {
		// Sent to the socket we took over from, or to one that is closing
		// (drain, takeover): tell the sender to look again.
		if m.Respond != nil {
			_ = m.Respond(movedReply) // lost with the bus: the sender's request times out
		}
		return
	}
	if out.Cached && m.Respond != nil && fenced(out.Op) {
		// The sender took out.Epoch from its owner cache: the phone may
		// have moved to a newer socket whose takeover notice has not
		// reached us yet (on a NATS cluster it crosses other routes than
		// this request). Write only if the owner record, read now, still
		// names this socket; the same read fences the write (fenceOwner).
		looked := s.owners.read(c.device)
		s.goFunc(func() {
			l := <-looked
			if l.err == nil && l.owner.Epoch > c.epoch.Load() {
				s.tel.m.deliveryMoved()
				_ = m.Respond(movedReply) // lost with the bus: the sender's request times out
				return
			}
			got := make(chan ownerResult, 1)
			got <- l
			s.write(c, m, out, got)
		})
		return
	}
	s.write(c, m, out, nil)
}

// write writes out to c and answers m (see onDelivery). looked is the
// owner read that fences the write, or nil to read it now.
func (s *Server) write(c *conn, m *bus.Msg, out wire.Output, looked <-chan ownerResult) {
	respond := func(acked bool, err error) {
		o := wire.OutcomeDelivered
		switch {
		case errors.Is(err, errNotAcked), err == nil && out.WaitAck && !acked:
			o = wire.OutcomeWritten
		case errors.Is(err, store.ErrNotFound):
			o = wire.OutcomeGone
		case errors.Is(err, errMoved):
			o = wire.OutcomeMoved
		case err != nil:
			o = wire.OutcomeOffline
		}
		errText := ""
		if err != nil {
			errText = err.Error()
		}
		data := wire.EncodeOutputReply(o, errText)
		if m.Respond != nil {
			_ = m.Respond(data) // lost with the bus: the sender's request times out
		}
	}
	done := func(err error) { respond(false, err) }
	if m.Respond != nil && fenced(out.Op) {
		// Written, then fenced by the owner, then (for a phone that acks)
		// acknowledged by the phone.
		if looked == nil {
			looked = s.owners.read(c.device)
		}
		done = s.fenceOwner(c, looked, c.awaitAck(out, respond))
	}
	ctx, done := s.tel.traceDelivery(s.ctx, m.Header, out.TraceParent, out.Op, done)
	c.mu.Lock()
	if !c.flags.is(flagReady) {
		c.held = append(c.held, heldItem{out: out, done: done})
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if out.Op == wire.OpMedia {
		// Fetching the bytes is I/O: do not hold up other devices' deliveries.
		s.goFunc(func() {
			ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
			defer cancel()
			c.render(ctx, out, done)
		})
		return
	}
	c.render(ctx, out, done)
}

// answerNoSocket answers out, addressed at out.Epoch to a socket this edge
// no longer has. When the owner record names a newer socket (or one is
// here now), the answer is "moved" and the sender looks again (that
// socket's edge, if it got the request too, also answers "moved": out's
// epoch is not its own); otherwise the device is not connected and the
// sender keeps out in the outbox, which the device's next socket reads.
// A request addressed to the socket that holds the device now (on another
// edge, or here) gets no answer from here: that socket's edge writes it
// and answers, and a "moved" from here could reach the sender first and
// have it written twice. direct (the edge's output subject, which no other
// edge gets) always answers.
func (s *Server) answerNoSocket(m *bus.Msg, out wire.Output, direct bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), s.cfg.OpTimeout)
	defer cancel()
	owner, err := s.store.DeviceOwner(ctx, out.Device)
	c := s.deviceConn(out.Device)
	if !direct && (c != nil && c.epoch.Load() == out.Epoch || c == nil && err == nil && owner.Edge != s.cfg.ID && owner.Epoch == out.Epoch) {
		return // the device's socket at that epoch answers
	}
	r := wire.OutputReply(wire.OutcomeOffline, "device not connected")
	switch {
	case c != nil && (!direct || c.epoch.Load() == out.Epoch),
		err == nil && (owner.Edge != s.cfg.ID || owner.Epoch != out.Epoch):
		// A socket is here now, or the device has another owner: the
		// sender looks again. (An older socket still here while the
		// owner's is not registered yet is "not connected": what the
		// sender keeps, the new socket reads from the outbox once
		// registered.)
		r = wire.OutputReply(wire.OutcomeMoved, "device moved")
	}
	data, _ := wire.Marshal(r)
	_ = m.Respond(data) // a sender that went away needs no answer
}

// errMoved: the device has a newer owner than the connection a delivery
// was written to; the sender looks again.
var errMoved = errors.New("device moved")

// fenced reports whether a delivery of op is acknowledged only by the
// device's current owner: the outputs the router keeps until delivered.
func fenced(op string) bool {
	switch op {
	case wire.OpMessage, wire.OpMedia, wire.OpPrompt, wire.OpPromptDone:
		return true
	}
	return false
}

// fenceOwner wraps done so that a delivery written to c counts only if c
// owned its device when the delivery arrived here. An edge that was paused
// (a GC pause, a starved CPU, a stalled VM) can wake with a delivery
// stamped with its own, by then old, epoch and write it into a socket the
// phone has given up on: the write succeeds, but the phone holds a newer
// epoch on another edge. Then the sender is told the device moved, and
// sends again to the current owner (the phone may get it twice; the app
// replaces a message by id). A store that cannot be asked makes the
// delivery fail: the router keeps the output for the outbox.
//
// looked is the owner as read when the delivery arrived, beside the write
// (the bus's dispatcher does not wait for it), not after the write: a
// phone that read the frames and then moved to another edge must not get
// them twice. The read goes in ownerReads' next batch, which starts after
// the delivery arrived, never in one already in flight.
func (s *Server) fenceOwner(c *conn, looked <-chan ownerResult, done func(error)) func(error) {
	return func(err error) {
		if err != nil {
			done(err)
			return
		}
		judge := func(l ownerResult) {
			switch {
			case l.err == nil && l.owner.Epoch <= c.epoch.Load():
				done(nil)
			case errors.Is(l.err, store.ErrNotFound) && !c.isClosing():
				// The record was lost (the store restarted) and nobody
				// claimed since: claim it again now, not at the next
				// heartbeat, so that senders find the device.
				done(nil)
				epoch := c.epoch.Load()
				s.goFunc(func() { s.recover(c.device, epoch) })
			case l.err == nil, errors.Is(l.err, store.ErrNotFound):
				s.tel.m.deliveryMoved()
				done(errMoved)
			default:
				done(fmt.Errorf("written, but the device's owner could not be checked: %w", l.err))
			}
		}
		select {
		case l := <-looked:
			judge(l)
		default:
			s.goFunc(func() { judge(<-looked) })
		}
	}
}

// render writes out as Protocol v1 frames; done runs once they are written.
func (c *conn) render(ctx context.Context, out wire.Output, done func(error)) {
	var frames [][]byte
	avatar := ""
	switch out.Op {
	case wire.OpMessage:
		parts := protocol.SplitText(out.Text, protocol.DefaultChunkLimit)
		for i, p := range parts {
			frames = append(frames, textFrame(protocol.AppendMessage(newFrame(len(p)+96+len(out.ID)), protocol.Message{
				ID: out.ID, Text: p, Index: i, Total: len(parts), Final: out.Final && i == len(parts)-1, Edit: out.Edit,
			})))
		}
		avatar = protocol.AvatarSpeaking
	case wire.OpMedia:
		var err error
		if frames, err = c.mediaFrames(ctx, out); err != nil {
			c.logger().WarnContext(ctx, "media delivery failed", "err", err)
			if done != nil {
				done(err)
			}
			return
		}
		avatar = protocol.AvatarSpeaking
	case wire.OpPrompt:
		if out.Prompt == nil {
			break
		}
		frames = append(frames, textFrame(protocol.AppendPrompt(newFrame(512), *out.Prompt)))
		avatar = protocol.AvatarSpeaking // a card is the agent's answer for now
	case wire.OpPromptDone:
		if d := out.PromptDone; d != nil {
			frames = append(frames, textFrame(protocol.AppendPromptDone(newFrame(64), protocol.PromptDone{
				ID: d.ID, OptionID: d.OptionID, Expired: d.Expired,
			})))
		}
	case wire.OpTyping:
		if out.Stop {
			frames = append(frames, textFrame(protocol.AppendTyping(newFrame(32), true)))
			avatar = protocol.AvatarIdle
		} else {
			c.setAvatar(protocol.AvatarThinking, nil)
			frames = append(frames, textFrame(protocol.AppendTyping(newFrame(32), false)))
		}
	case wire.OpAvatar:
		avatar = protocol.AvatarState(out.State)
	default:
		c.logger().DebugContext(ctx, "ignoring unknown output", "op", out.Op)
	}
	if len(frames) > 0 && (out.Op == wire.OpMessage && !out.Edit || out.Op == wire.OpMedia || out.Op == wire.OpPrompt) {
		// A message (its streamed edits are the same one), a file or a card.
		c.use.Load().Add(usage.MessagesOut, 1)
	}
	c.enqueueBatch(frames, avatar, done)
}

// mediaFrames fetches the file and cuts it into 3 MiB chunks.
func (c *conn) mediaFrames(ctx context.Context, out wire.Output) ([][]byte, error) {
	m := out.Media
	if m == nil {
		return nil, nil
	}
	var data []byte
	if m.Blob != "" {
		var err error
		if data, err = c.srv.store.GetBlob(ctx, m.Blob); err != nil {
			return nil, err
		}
	}
	chunk := protocol.MediaChunk{
		ID: out.ID, Kind: m.Kind, Mime: protocol.MimeOf(m.Mime, m.Filename), Filename: m.Filename,
		Caption: m.Caption, Size: len(data), URL: m.URL, ReplyTo: m.ReplyTo,
	}
	if chunk.Filename == "" {
		chunk.Filename = out.ID
	}
	chunk.Parts = max(1, (len(data)+protocol.MediaChunkBytes-1)/protocol.MediaChunkBytes)
	frames := make([][]byte, 0, chunk.Parts)
	for i := range chunk.Parts {
		chunk.Part = i
		chunk.Data = data[i*protocol.MediaChunkBytes : min(len(data), (i+1)*protocol.MediaChunkBytes)]
		chunk.Final = i == chunk.Parts-1
		frames = append(frames, textFrame(protocol.AppendMedia(newFrame(protocol.MediaFrameSize(chunk)), chunk)))
	}
	return frames, nil
}

// enqueueBatch queues frames, then moves the avatar to state (when not
// empty); done runs when all of it is written.
func (c *conn) enqueueBatch(frames [][]byte, state string, done func(error)) {
	for i, f := range frames {
		if i == len(frames)-1 && state == "" {
			c.enqueue(f, done)
			return
		}
		c.enqueue(f, nil)
	}
	c.setAvatar(state, done)
}

// setAvatar moves the avatar state machine: a frame is sent only on a change;
// speaking returns to idle after TypingIdle without messages, thinking after
// ThinkingIdle. done runs once the frames before it are written. The state
// and its frame are queued under one lock, so avatar frames keep their order.
func (c *conn) setAvatar(state string, done func(error)) {
	c.mu.Lock()
	if c.flags.is(flagClosing | flagClosed) {
		c.mu.Unlock()
		if done != nil {
			done(errClientClosed)
		}
		return
	}
	if state == "" {
		state = c.avatar
	}
	changed := state != c.avatar
	c.avatar = state
	c.armIdleLocked()
	var after func()
	switch {
	case changed:
		after = c.queueLocked(textFrame(protocol.AppendAvatar(newFrame(40), state)), done)
	case done != nil:
		after = c.markerLocked(done)
	}
	c.mu.Unlock()
	run(after)
}

// armIdleLocked (re)starts the timer that returns the avatar to idle.
func (c *conn) armIdleLocked() {
	var d time.Duration
	switch c.avatar {
	case protocol.AvatarSpeaking:
		d = c.srv.cfg.TypingIdle
	case protocol.AvatarThinking:
		d = c.srv.cfg.ThinkingIdle
	default:
		if c.idle != nil {
			c.idle.Stop()
		}
		return
	}
	if c.idle == nil {
		c.idle = time.AfterFunc(d, c.idleTimeout)
		return
	}
	c.idle.Reset(d)
}

func (c *conn) idleTimeout() {
	c.mu.Lock()
	if c.avatar == protocol.AvatarIdle || c.flags.is(flagClosing) {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.setAvatar(protocol.AvatarIdle, nil)
}

// onUserTyping: the user is engaged, so a speaking avatar stays awake.
func (c *conn) onUserTyping() {
	c.mu.Lock()
	if c.avatar == protocol.AvatarSpeaking {
		c.armIdleLocked()
	}
	c.mu.Unlock()
}

// markerLocked arranges for done to run after everything queued so far is
// written; c.mu is held before and after. It returns what must run once
// c.mu is released.
func (c *conn) markerLocked(done func(error)) (after func()) {
	if len(c.out) == 0 && !c.flags.is(flagWriting) {
		return func() { done(nil) }
	}
	return c.queueLocked(nil, done)
}
