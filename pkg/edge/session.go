package edge

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// handle runs one message from the app. A panic is caught, logged with the
// device and answered with internal_error: no input may kill the node.
func (c *conn) handle(msg []byte) {
	defer func() {
		if r := recover(); r != nil {
			c.logger().Error("panic while handling a frame", "device", c.device, "panic", r, "stack", string(debug.Stack()))
			c.sendError(failPanic.frame())
		}
	}()
	f, err := protocol.Decode(msg)
	var perr *protocol.Error
	errors.As(err, &perr)
	c.srv.tel.frameIn(f, perr != nil)
	c.mu.Lock()
	helloed := c.flags.is(flagHelloed)
	c.mu.Unlock()
	if !helloed {
		switch {
		case perr != nil && protocol.TypeOf(msg) == protocol.TypeHello:
			c.fatal(perr)
		case perr != nil, f == nil || f.Type() != protocol.TypeHello:
			c.fatal(protocol.NewError(protocol.CodeBadFrame, "the first frame must be hello"))
		default:
			c.hello(f.(*protocol.Hello))
		}
		return
	}
	if perr != nil {
		if !c.deliverOK && protocol.TypeOf(msg) == protocol.TypeDeliver {
			perr = errDeliverForbidden // permission is judged before contents
		}
		c.sendError(perr)
		return
	}
	switch f := f.(type) {
	case nil:
		c.logger().Debug("ignoring a frame of unknown type")
	case *protocol.Hello:
		c.sendError(protocol.NewError(protocol.CodeBadFrame, "repeated hello"))
	case *protocol.Text:
		c.onText(f)
	case *protocol.Audio:
		c.onAudio(f)
	case *protocol.MediaUp:
		c.onMedia(f)
	case *protocol.PromptAnswer:
		c.onPromptAnswer(f)
	case *protocol.Typing:
		c.onUserTyping()
	case *protocol.Ping:
		c.send(protocol.AppendPong(newFrame(32+len(f.TS)), f.TS))
	case *protocol.Ack:
		c.onAck(f.ID)
	case *protocol.Deliver:
		c.onDeliver(f)
	case *protocol.Push:
		c.onPush(f)
	}
}

func (c *conn) sendError(e *protocol.Error) {
	c.srv.tel.m.error(string(e.Code))
	c.send(protocol.AppendError(newFrame(128), e))
}

func (c *conn) opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.srv.ctx, c.srv.cfg.OpTimeout)
}

// compensationContext is for undoing a step after a failure: the frame's
// own context may be what expired.
func (c *conn) compensationContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(c.srv.ctx), c.srv.cfg.OpTimeout)
}

// release forgets a dedup claim whose delivery failed, so a resend counts.
func (c *conn) release(key, attempt string) {
	ctx, cancel := c.compensationContext()
	defer cancel()
	if err := c.srv.store.Release(ctx, key, attempt); err != nil {
		c.keepAttempt(key, attempt)
		c.logger().Warn("releasing a dedup key failed", "err", err)
	}
}

// maxKeptAttempts bounds the claim attempts a connection remembers.
const maxKeptAttempts = 64

// attemptFor returns the attempt token for a claim of key: the one kept from
// a claim whose outcome is unknown, or a new one.
func (c *conn) attemptFor(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.attempts[key]; ok {
		delete(c.attempts, key)
		return a
	}
	return ids.Hex(8)
}

// keepAttempt remembers the attempt of a claim whose outcome is unknown.
func (c *conn) keepAttempt(key, attempt string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.attempts == nil {
		c.attempts = make(map[string]string)
	}
	if len(c.attempts) >= maxKeptAttempts {
		for k := range c.attempts {
			delete(c.attempts, k)
			break
		}
	}
	c.attempts[key] = attempt
}

// evict closes a socket that has not said hello, whose place in the hello
// phase went to a newcomer, at once: a close frame would keep its reader
// and message, which the newcomer was promised, until the peer answered.
func (c *conn) evict() { c.teardown(errEvicted) }

func (c *conn) helloTimeout() {
	c.mu.Lock()
	helloed := c.flags.is(flagHelloed)
	c.mu.Unlock()
	if !helloed {
		c.fatal(protocol.NewError(protocol.CodeBadFrame, fmt.Sprintf("no hello within %v", c.srv.cfg.HelloTimeout)))
	}
}

func (c *conn) hello(h *protocol.Hello) {
	start := time.Now()
	s := c.srv
	defer s.helloDone(c)
	g := s.auth.check(h.Token)
	if !g.valid {
		c.fatal(protocol.NewError(protocol.CodeAuthFailed, "invalid token"))
		return
	}
	dev := h.Device
	if dev.ID == "" {
		dev.ID = "dev-" + ids.Hex(6)
	}
	if !s.auth.allowedDevice(g, dev.ID) {
		c.fatal(protocol.NewError(protocol.CodeAuthFailed, "device is not allowed"))
		return
	}
	if !s.auth.bindingOK(g, dev.ID) {
		c.fatal(protocol.NewError(protocol.CodeForbidden, "this token and this device id are bound to others"))
		return
	}
	// Inside the cluster the device is its owner's: every key of the
	// store and the bus uses its device key, never the id alone.
	key, err := tenant.Scope(g.owner(), dev.ID)
	if err != nil {
		c.fatal(protocol.NewError(protocol.CodeBadFrame, err.Error()))
		return
	}
	s.helloAccepted(c)
	ctx, cancel := c.opContext()
	defer cancel()
	// A file owner's socket takes its place in the owner's connections
	// quota, across every edge: one store round trip, none for the legacy
	// owner. The device's own place (a reconnect) is always its own.
	if owner := g.owner(); owner != tenant.Legacy {
		limit := s.auth.tenants.Snapshot().QuotaOf(owner).Connections
		ok, _, err := s.store.AcquireLease(ctx, tenant.QuotaKey(owner, tenant.QuotaConnections), key, limit, s.cfg.OwnerTTL)
		if err != nil {
			c.logger().Warn("taking a place in the owner's connections quota failed", "device", key, "err", err)
			c.fatal(failClaimDevice.frame())
			return
		}
		if !ok {
			s.tel.process.QuotaRefused(telemetry.QuotaConnections)
			s.cfg.Usage.Refused(owner, tenant.QuotaConnections, 1)
			c.fatal(failConnQuota.frame(owner, limit))
			return
		}
		c.leased.Store(true)
	}
	// The claim also says whether the device acked on an earlier socket:
	// then what this socket writes, from the outbox on, counts only once
	// acked.
	claim, err := s.store.ClaimDeviceAcks(ctx, key, s.cfg.ID, s.recordTTL())
	epoch, acks := claim.Epoch, claim.Acks
	if err != nil {
		c.logger().Warn("claiming device failed", "device", key, "err", err)
		c.fatal(failClaimDevice.frame())
		c.releaseConnLease(key)
		return
	}
	c.id = s.cfg.ID + "/" + fmt.Sprint(epoch)
	c.device, c.sessionName = key, protocol.Session(key)
	c.epoch.Store(epoch)
	c.devName = dev.Name
	c.user.id, c.user.name = h.User.ID, h.User.Name
	c.auth = s.auth.kind(g, dev.ID)
	c.deliverOK = g.deliver || c.client.IsLoopback() && g.key == nil
	c.mu.Lock()
	c.flags.set(flagHelloed)
	c.key = g.key
	if acks {
		c.flags.set(flagAcking)
	}
	closing := c.flags.is(flagClosing)
	c.mu.Unlock()
	if closing {
		return
	}
	// A reload that removed the key while this hello used it: its sweep
	// of the sockets may have run before c had a key (revoke).
	if g.key != nil && !s.auth.tenants.Snapshot().Has(g.key) {
		c.fatal(errKeyRevoked)
		return
	}
	ok, reread, err := s.register(c)
	if err != nil {
		c.logger().Warn("subscribing device failed", "err", err)
		c.fatal(failSubscribe.frame())
		return
	}
	if !ok {
		c.replacedByNewer()
		return
	}
	// A hello racing ours on another edge that claimed a newer epoch
	// sent its takeover notice to this edge, whose record it replaced:
	// register saw it if it came before. An edge of the release before
	// edge subjects announces on the device's subject, which we hear only
	// from now on: with device subjects, look once more.
	if s.deviceSubs { // shim(v0.2.0): Config.DeviceSubjects.
		if owner, err := s.owners.get(ctx, dev.ID); err == nil && owner.Epoch > epoch {
			c.replacedByNewer()
			return
		}
	}
	s.announceTakeover(ctx, c, claim.Prev)
	c.send(protocol.AppendReady(newFrame(512), protocol.Ready{
		Session: protocol.Session(dev.ID), DeviceID: dev.ID, DeviceName: dev.Name, AvatarURL: c.avatarURL, Push: s.cfg.Push.AppKinds(),
	}))
	c.srv.tel.m.helloReady(time.Since(start))
	if use := s.cfg.Usage.Owner(g.owner()); use != nil {
		c.mu.Lock()
		if !c.flags.is(flagClosed) {
			c.use.Store(use)
			use.Opened()
		}
		c.mu.Unlock()
	}
	c.logger().Debug("session ready", "epoch", epoch)
	// A large outbox is written at the pace the phone reads it: meanwhile
	// the phone's frames are handled, and a drain may close the socket.
	// An outbox the claim found empty is not read, unless a router said
	// it kept something since (register's reread); what it keeps from
	// now on, its notice has this socket read.
	read := claim.Outbox || reread
	s.goFunc(func() { c.flushOutbox(read) })
}

// announceTakeover tells the edge of prev, the owner record c's claim
// replaced, that its older socket of the device closes. A socket here was
// closed by register; with no record, no socket of the device is left
// elsewhere but one whose edge lost touch with the store, whose heartbeat
// closes it. With device subjects (a rolling upgrade) the notice goes on
// the device's subject too, where edges of the release before edge
// subjects hear it.
func (s *Server) announceTakeover(ctx context.Context, c *conn, prev store.Owner) {
	if prev.Edge == s.cfg.ID {
		prev = store.Owner{} // a socket here was closed by register
	}
	// shim(v0.2.0): s.deviceSubs, Config.DeviceSubjects.
	if err := s.sender.NotifyAt(ctx, prev, wire.Control{Op: wire.OpTakeover, Device: c.device, Epoch: c.epoch.Load()}, s.deviceSubs); err != nil {
		c.logger().Warn("announcing takeover failed", "err", err)
	}
}

// flushOutbox writes what the agent sent while the device was away (when
// read), then lets live deliveries through in order behind it.
func (c *conn) flushOutbox(read bool) {
	if read {
		c.writeOutbox()
	}
	for {
		c.mu.Lock()
		held := c.held
		c.held = nil
		if len(held) == 0 {
			c.flags.set(flagReady)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		for _, h := range held {
			if h.reread {
				c.writeOutbox()
				continue
			}
			ctx, cancel := c.opContext()
			c.render(ctx, h.out, h.done)
			cancel()
		}
	}
}

// submit hands an event to the agent side once per <chat_id>:<id>.
// dedupKey is the store's dedup key of a device's message id. The device
// is length-prefixed, so no (device, id) pair shares its key with another:
// device "phone:alice" id "7" is not device "phone" id "alice:7".
func dedupKey(device, id string) string {
	return strconv.Itoa(len(device)) + ":" + device + ":" + id
}

func (c *conn) submit(ev wire.Event, blob []byte) {
	ctx, cancel := c.opContext()
	defer cancel()
	ctx, span := c.srv.tel.startEvent(ctx, ev.Kind)
	defer span.End()
	st := c.srv.store
	key := dedupKey(c.device, ev.ID)
	attempt := c.attemptFor(key)
	first, err := st.Claim(ctx, key, attempt, c.srv.cfg.ClaimTTL)
	if errors.Is(err, store.ErrPending) {
		// Another connection (a socket the phone gave up on, an edge that
		// died) claimed this id and has not handed it over yet: its
		// attempt may still fail, so this one must not be dropped.
		c.logger().DebugContext(ctx, "id claimed by another attempt", "id", ev.ID)
		c.sendError(failTextPending.frame())
		return
	}
	if err != nil {
		// The claim may still take effect (a reply lost, a command run
		// late): keep the attempt, so the phone's resend claims as us.
		c.keepAttempt(key, attempt)
		c.logger().WarnContext(ctx, "dedup failed", "err", err)
		c.sendError(failTextDedup.frame())
		return
	}
	if !first {
		c.srv.tel.m.dedupHit()
		c.logger().DebugContext(ctx, "dropping duplicate", "id", ev.ID)
		return
	}
	if blob != nil {
		// In its owner's space: only its owner's agent reads it.
		blobKey, err := st.PutBlobIn(ctx, tenant.OwnerOf(c.device), blob, c.srv.cfg.BlobTTL)
		if err != nil {
			c.release(key, attempt)
			c.logger().WarnContext(ctx, "storing media failed", "err", err)
			why := failMediaStore
			if errors.Is(err, store.ErrFull) {
				why = failMediaFull
			}
			c.sendError(why.frame())
			return
		}
		ev.Media.Blob = blobKey
	}
	// Thinking goes out before the agent can answer.
	c.setAvatar(protocol.AvatarThinking, nil)
	if err := c.srv.publishEvent(ctx, c, ev); err != nil {
		c.release(key, attempt)
		c.logger().WarnContext(ctx, "handing event to the agent failed", "err", err)
		c.sendError(failTextAgent.frame())
		c.setAvatar(protocol.AvatarIdle, nil)
		return
	}
	// Handed over: from now on a resend is a duplicate.
	cctx, ccancel := c.compensationContext()
	defer ccancel()
	if err := st.Confirm(cctx, key, attempt, protocol.DedupWindow); err != nil {
		// The claim lapses by itself; a resend after that is handed over
		// again (a duplicate, never a loss).
		c.logger().WarnContext(ctx, "confirming a dedup key failed", "err", err)
	}
}

// publishEvent sends ev to a router and waits for it to take it.
func (s *Server) publishEvent(ctx context.Context, c *conn, ev wire.Event) error {
	ev.Session, ev.Device, ev.UserID, ev.User = c.sessionName, c.device, c.user.id, c.user.name
	ev.Auth, ev.Epoch = c.auth, c.epoch.Load()
	ev.TraceParent = telemetry.TraceParent(ctx)
	data, err := wire.Marshal(ev)
	if err != nil {
		return err
	}
	reply, err := s.bus.Request(ctx, bus.InboundSubject, data, nil)
	if err != nil {
		return err
	}
	var r wire.Reply
	if err := wire.Unmarshal(reply, &r); err != nil {
		return err
	}
	if !r.OK {
		return errors.New(r.Error)
	}
	c.use.Load().Add(usage.MessagesIn, 1)
	return nil
}

func (c *conn) newEvent(kind, id string) wire.Event {
	return wire.Event{Kind: kind, ID: id, Edge: c.srv.cfg.ID}
}

func (c *conn) onText(f *protocol.Text) {
	ev := c.newEvent(wire.EventText, f.ID)
	ev.Text = f.Text
	c.submit(ev, nil)
}

func (c *conn) onAudio(f *protocol.Audio) {
	ev := c.newEvent(wire.EventAudio, f.ID)
	ev.Text, ev.Format = f.Text, f.Format
	ev.Media = &wire.MediaRef{Kind: "audio", Mime: "audio/" + f.Format, Filename: f.ID + "." + f.Format, Size: len(f.Data)}
	c.submit(ev, f.Data)
}

// uploadMeta is what the store keeps of a multi-part upload besides bytes.
type uploadMeta struct {
	Kind     string `json:"kind"`
	Mime     string `json:"mime"`
	Filename string `json:"filename"`
	Caption  string `json:"caption"`
}

func (c *conn) onMedia(f *protocol.MediaUp) {
	meta := uploadMeta{f.Kind, f.Mime, f.Filename, f.Caption}
	ctx, cancel := c.opContext()
	key := dedupKey(c.device, f.ID)
	if f.Parts > 1 {
		seen, err := c.srv.store.Seen(ctx, key)
		if err == nil && seen {
			c.srv.tel.m.dedupHit()
			cancel()
			return // a file already delivered: judged by the whole file
		}
	}
	part := store.Part{Device: c.device, Conn: c.id, ID: f.ID, Index: f.Part, Count: f.Parts, Data: f.Data}
	if f.Parts == 1 {
		// A whole file in one frame: the store only checks that it does
		// not contradict an open upload of the same id; the bytes stay here.
		part.Data = nil
	} else {
		part.Meta, _ = wire.Marshal(meta)
	}
	charged := false
	if f.Parts > 1 {
		var ok bool
		if charged, ok = c.chargeUpload(f.ID, f.Part, f.Parts, int64(len(f.Data)), int64(len(part.Meta))); !ok {
			cancel()
			c.logger().Warn("refusing an upload part: the edge's upload budget is spent", "budget", c.srv.cfg.MaxUploadBytes)
			c.sendError(failUploadBudget.frame())
			return
		}
	}
	c.mu.Lock()
	c.flags.set(flagUploaded)
	c.mu.Unlock()
	up, err := c.srv.store.PutPart(ctx, part, store.UploadLimits{
		MaxOpen: protocol.MaxOpenUploads, MaxFileBytes: protocol.MaxMediaBytes, MaxBytes: protocol.MaxUploadBufferBytes,
	})
	cancel()
	if f.Parts > 1 {
		switch {
		case err == nil && up == nil:
			c.srv.tel.m.upload(len(f.Data))
		case err == nil, errors.Is(err, store.ErrTooManyUploads), errors.Is(err, store.ErrUploadTooBig), errors.Is(err, store.ErrUploadMismatch):
			c.releaseUpload(f.ID) // completed, or discarded by the store
		case charged:
			c.unchargeUpload(f.ID, f.Part, int64(len(f.Data))) // not stored
		}
	}
	switch {
	case errors.Is(err, store.ErrTooManyUploads):
		c.sendError(protocol.NewError(protocol.CodeTooBig, "too many unfinished uploads (at most "+strconv.Itoa(protocol.MaxOpenUploads)+" per device)"))
		return
	case errors.Is(err, store.ErrUploadTooBig):
		c.sendError(protocol.NewError(protocol.CodeTooBig, "upload buffers would exceed "+protocol.MiB(protocol.MaxUploadBufferBytes)+" for this device"))
		return
	case errors.Is(err, store.ErrUploadMismatch):
		c.sendError(protocol.NewError(protocol.CodeBadFrame, "parts differs from the earlier chunks of this file"))
		return
	case err != nil:
		c.logger().Warn("buffering upload failed", "err", err)
		c.sendError(failUploadStore.frame())
		return
	case up == nil:
		return // more parts to come
	}
	data := f.Data
	if f.Parts > 1 {
		data = up.Data
		_ = wire.Unmarshal(up.Meta, &meta) // written by this edge's json.Marshal
	}
	ev := c.newEvent(wire.EventMedia, f.ID)
	ev.Text = meta.Caption
	ev.Media = &wire.MediaRef{Kind: meta.Kind, Mime: meta.Mime, Filename: meta.Filename, Caption: meta.Caption, Size: len(data)}
	c.submit(ev, data)
}

func (c *conn) onPromptAnswer(f *protocol.PromptAnswer) {
	st := c.srv.store
	ctx, cancel := c.opContext()
	defer cancel()
	ctx, span := c.srv.tel.startEvent(ctx, wire.EventPrompt)
	defer span.End()
	rec, err := st.TakePrompt(ctx, f.PromptID, c.device)
	switch {
	case errors.Is(err, store.ErrNotFound):
		c.send(protocol.AppendPromptDone(newFrame(64), protocol.PromptDone{ID: f.PromptID, Expired: true}))
		return
	case errors.Is(err, store.ErrForbidden):
		c.sendError(protocol.NewError(protocol.CodeForbidden, "this card belongs to another device"))
		return
	case err != nil:
		c.logger().WarnContext(ctx, "reading prompt failed", "err", err)
		c.sendError(failPromptStore.frame())
		return
	}
	applied := protocol.ResolveOption(rec.Kind, f.OptionID, f.Text, rec.Choices)
	var card protocol.Prompt
	if rec.Kind != protocol.PromptClarify && wire.Unmarshal(rec.Data, &card) == nil && len(card.Options) > 0 &&
		!protocol.Offered(card.Options, applied) {
		applied = protocol.SafeOption(rec.Kind) // a button the card did not show
	}
	ev := c.newEvent(wire.EventPrompt, "")
	ev.Prompt = &wire.PromptRef{ID: rec.ID, Kind: rec.Kind, Option: applied}
	if rec.Kind == protocol.PromptClarify && applied == protocol.OptionOther {
		ev.Prompt.Text = f.Text
	}
	// The card closes before the agent can act on the answer.
	c.send(protocol.AppendPromptDone(newFrame(64), protocol.PromptDone{ID: rec.ID, OptionID: applied}))
	if err := c.srv.publishEvent(ctx, c, ev); err != nil {
		c.logger().WarnContext(ctx, "handing answer to the agent failed", "err", err)
		c.sendError(failPromptAgent.frame())
		rctx, rcancel := c.compensationContext()
		defer rcancel()
		if perr := st.PutPrompt(rctx, rec); perr != nil {
			c.logger().WarnContext(ctx, "restoring prompt failed", "err", perr)
			return
		}
		c.reshowCard(rec)
	}
}

// reshowCard sends a card again (with the time it has left) after an
// answer could not reach the agent.
func (c *conn) reshowCard(rec store.PromptRecord) {
	var card protocol.Prompt
	if len(rec.Data) == 0 || wire.Unmarshal(rec.Data, &card) != nil {
		return
	}
	card.TimeoutSeconds = max(1, int(time.Until(rec.Expires).Seconds()+0.5))
	c.send(protocol.AppendPrompt(newFrame(512), card))
}

// onPush registers the app's push token for the socket's own device
// (which a token bound to a device can only be), as PUT
// /v1/devices/{device}/push does, or, with an empty token, takes back the
// device's registration of that kind; either is answered with a push
// frame saying which.
func (c *conn) onPush(f *protocol.Push) {
	p := c.srv.cfg.Push
	if !p.Offers(f.Kind) {
		c.sendError(protocol.NewError(protocol.CodeUnsupportedFrame, "push: this server sends no "+f.Kind+" notifications (ready's capabilities.push lists those it sends)"))
		return
	}
	t := push.Target{Kind: f.Kind, Token: f.Token}
	if f.Token != "" {
		if err := p.Check(t); err != nil {
			c.sendError(protocol.NewError(protocol.CodeBadFrame, "push: "+err.Error()))
			return
		}
	}
	ctx, cancel := c.opContext()
	defer cancel()
	var err error
	if f.Token != "" {
		err = p.Register(ctx, c.device, t)
	} else {
		_, err = p.Unregister(ctx, c.device, f.Kind)
	}
	if err != nil {
		c.logger().Warn("push registration failed", "kind", f.Kind, "err", err)
		c.sendError(failPushStore.frame())
		return
	}
	c.logger().Debug("push registration", "kind", f.Kind, "registered", f.Token != "")
	c.send(protocol.AppendPush(newFrame(64), f.Kind, f.Token != ""))
}

// errKeyRevoked closes a socket whose owner key the tenants file no
// longer holds.
var errKeyRevoked = protocol.NewError(protocol.CodeAuthFailed, "this key was withdrawn")

var errDeliverForbidden = protocol.NewError(protocol.CodeForbidden, "deliver is accepted only from cron: a loopback peer or a deliver token")

func (c *conn) onDeliver(f *protocol.Deliver) {
	if !c.deliverOK {
		c.sendError(errDeliverForbidden)
		return
	}
	target, e := c.srv.deliverer.TargetOf(tenant.OwnerOf(c.device), f)
	if e != nil {
		c.sendError(e)
		return
	}
	size := len(f.Text)
	if f.Media != nil {
		size += len(f.Media.Data)
	}
	if c.cron == nil { // made on the first deliver frame: most connections never send one
		c.cron = newCronQueue()
	}
	err := c.cron.push(c.srv.ctx, c.srv.goFunc, target, size, func() { c.deliver(f) })
	if err != nil { // the edge is closing
		c.sendError(failDeliverClosed.frame(f.ID))
	}
}

// deliver sends deliver frame f through the one delivery path
// (dispatch.Deliverer, as POST /v1/deliver does) and answers the sender
// with what became of it: delivered when the API would answer 200 (with
// "queued":true when it would answer 202 {"queued":true}), device_offline
// when no edge holds the device or it was written but not acknowledged in
// time (the API's 404 and 202), the refusal's error, or internal_error
// when the store or the bus failed (the API's 5xx). docs/protocol-notes.md
// has the table.
func (c *conn) deliver(f *protocol.Deliver) {
	ctx, cancel := context.WithTimeout(c.srv.ctx, dispatch.DefaultTimeout)
	defer cancel()
	// The sender's owner is its credential's, whose device key c.device is.
	d, err := c.srv.deliverer.DeliverAs(ctx, tenant.OwnerOf(c.device), f)
	dev := d.DeviceID() // what the sender named: never the device key
	if err != nil {
		c.logger().Warn("deliver failed", "target", d.Device, "err", err)
		c.sendError(failDeliver.frame(d.ID, dev))
		return
	}
	switch d.Outcome {
	case dispatch.Delivered, dispatch.Written, dispatch.Queued:
		c.srv.cfg.Usage.Delivery(tenant.OwnerOf(c.device), true)
	case dispatch.Offline:
		c.srv.cfg.Usage.Delivery(tenant.OwnerOf(c.device), false)
	}
	switch d.Outcome {
	case dispatch.Delivered, dispatch.Queued:
		c.send(protocol.AppendDelivered(newFrame(48+len(d.ID)+len(dev)), d.ID, dev, d.Outcome == dispatch.Queued))
	case dispatch.Written:
		c.sendError(protocol.NewError(protocol.CodeDeviceOffline, "deliver "+d.ID+": written, but device "+dev+" did not acknowledge it in time; deliver again to be sure"))
	case dispatch.Offline:
		c.sendError(protocol.NewError(protocol.CodeDeviceOffline, "deliver "+d.ID+": device "+dev+" is not online"))
	case dispatch.Refused:
		c.sendError(d.Refusal)
	default:
		c.logger().Warn("deliver failed", "target", d.Device, "outcome", d.Outcome)
		c.sendError(failDeliver.frame(d.ID, dev))
	}
}

// releaseState frees what a closed connection held in the store.
func (c *conn) releaseState() {
	ctx, cancel := c.opContext()
	defer cancel()
	c.mu.Lock()
	uploaded := c.flags.is(flagUploaded)
	c.mu.Unlock()
	if uploaded { // most connections never upload: no store round trip for them
		if err := c.srv.store.DropUploads(ctx, c.device, c.id); err != nil {
			c.logger().Warn("freeing uploads failed", "err", err)
		}
	}
	if c.srv.deviceConn(c.device) == nil {
		if err := c.srv.store.ReleaseDevice(ctx, c.device, c.epoch.Load()); err != nil {
			c.logger().Warn("releasing device failed", "err", err)
		}
		if !c.replaced.Load() {
			c.releaseConnLease(c.device)
		}
	}
}

// releaseConnLease gives back the place c holds in its owner's
// connections quota, if it holds one. A failure leaves it until the lease
// lapses (OwnerTTL).
func (c *conn) releaseConnLease(device string) {
	if !c.leased.Load() {
		return
	}
	ctx, cancel := c.compensationContext()
	defer cancel()
	if err := c.srv.store.ReleaseLease(ctx, tenant.QuotaKey(tenant.OwnerOf(device), tenant.QuotaConnections), device); err != nil {
		c.logger().Warn("releasing a place in the owner's connections quota failed; it lapses within OwnerTTL", "err", err)
	}
}

// uploadEntryBytes is what an unfinished upload costs besides its id,
// metadata and bytes: its entries here and in the store.
const uploadEntryBytes = 256

// upload is what an unfinished upload of this connection holds of the
// edge's upload budget: its parts' bytes, and its id and metadata.
type upload struct {
	bytes int64
	count int
	got   map[int]bool // the parts stored
}

// chargeUpload takes n bytes of the edge's upload budget for part of the
// upload id in parts; the first part stored also takes what the upload's
// id and its meta bytes of metadata hold. The part that completes its file
// takes nothing: it is not buffered. ok is false when the bytes do not
// fit; charged says whether any were taken.
func (c *conn) chargeUpload(id string, part, parts int, n, meta int64) (charged, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flags.is(flagClosed) { // teardown has released the rest
		return false, false
	}
	u := c.uploads[id]
	if u != nil && u.count == parts && !u.got[part] && len(u.got) == parts-1 {
		return false, true
	}
	if u == nil || u.count != parts {
		n += uploadEntryBytes + int64(len(id)) + meta
	}
	if !c.srv.uploading.take(n) {
		return false, false
	}
	if u == nil || u.count != parts {
		if u != nil {
			c.srv.uploading.release(u.bytes) // the store discards it too
		}
		u = &upload{count: parts, got: make(map[int]bool)}
		if c.uploads == nil {
			c.uploads = make(map[string]*upload)
		}
		c.uploads[id] = u
	}
	u.bytes += n
	u.got[part] = true
	return true, true
}

// unchargeUpload gives back the n bytes charged for part of upload id,
// which was not stored.
func (c *conn) unchargeUpload(id string, part int, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.uploads[id]
	if u == nil { // teardown released it
		return
	}
	n = min(n, u.bytes)
	u.bytes -= n
	delete(u.got, part)
	if len(u.got) == 0 {
		delete(c.uploads, id)
		n += u.bytes // what its id and metadata held
	}
	c.srv.uploading.release(n)
}

// releaseUpload gives back everything upload id holds: its file completed
// or the store discarded it.
func (c *conn) releaseUpload(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u := c.uploads[id]; u != nil {
		delete(c.uploads, id)
		c.srv.uploading.release(u.bytes)
	}
}

// releaseUploads gives back what every upload of the connection holds; the
// store frees their buffers when the connection is gone.
func (c *conn) releaseUploads() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range c.uploads {
		c.srv.uploading.release(u.bytes)
	}
	c.uploads = nil
}
