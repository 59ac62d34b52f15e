package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermes-mobile/gateway/internal/retry"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// output is agent.Output for one device.
type output struct {
	r      *Router
	device string
	// hold: an output that can be neither delivered nor kept (the store is
	// away) is tried again until ctx ends, instead of failing after
	// RetryFor. The built-in agents' outputs hold: nobody would send them
	// again. The API's do not: its caller is told 503 and retries.
	hold bool
	// via: the edge the event being answered came from, tried when the
	// device has no owner record (wire.Output.Via).
	via string
	// share is what the outbox charges what it keeps of this output to
	// (shareFor); empty: dispatch.ShareAgent.
	share string
}

// shareFor is the share of the outbox's store-wide bound
// (store.OutboxLimits.Share) the answers to ev are charged to: the token
// that admitted its device, so that one token's made-up devices compete
// with each other, not with a phone of its own token or with cron
// (dispatch.ShareDeliver). A device of MOBILE_EXTRA_TOKENS is a share of
// its own. An owner of the tenants file is a share of its own, whatever
// its keys.
func shareFor(ev wire.Event) string {
	if o := tenant.OwnerOf(ev.Device); o != tenant.Legacy {
		return dispatch.OwnerShare(o) // an owner of the tenants file is one share
	}
	switch ev.Auth {
	case "device":
		return "device:" + ev.Device
	case "app", "deliver":
		return ev.Auth
	}
	return dispatch.ShareAgent
}

var _ agent.Output = (*output)(nil)

// send delivers out to the device, or keeps it in the device's outbox while
// the device is offline. While the bus or the store fails, it retries with
// backoff for RetryFor, then keeps the output in the outbox too: a reply is
// not lost to an outage. Typing and avatar states are moments, not
// messages: they are published without waiting, neither retried nor kept.
func (o *output) send(ctx context.Context, out wire.Output) error {
	out.Device, out.Via = o.device, o.via
	if out.Op == wire.OpTyping || out.Op == wire.OpAvatar {
		sctx, span := o.r.tel.start(ctx, "router.deliver", out.Op)
		err := o.r.sender.Publish(sctx, out)
		telemetry.EndSpan(span, err)
		if err != nil {
			o.r.log.DebugContext(ctx, "a typing or avatar state was not sent", "device", o.device, "err", err)
		}
		return nil
	}
	deadline := time.Now().Add(o.r.cfg.RetryFor)
	wait := retry.New(100*time.Millisecond, 2*time.Second)
	for {
		start := time.Now()
		sctx, span := o.r.tel.start(ctx, "router.deliver", out.Op)
		got, err := o.r.sender.Send(sctx, out)
		telemetry.EndSpan(span, dispatch.SpanErr(got, err))
		if err == nil {
			switch got {
			case dispatch.Delivered:
				o.r.tel.m.deliveryLatency(time.Since(start))
				return nil
			case dispatch.Gone:
				// No outbox: it would fail again on the next connect.
				return fmt.Errorf("%w: %s of %s", dispatch.ErrGone, out.ID, o.device)
			}
			break // offline, or written and not acknowledged: kept
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			o.r.log.WarnContext(ctx, "delivery keeps failing; keeping the output in the outbox", "device", o.device, "err", err)
			break
		}
		wait.Wait(ctx)
	}
	// Kept in the outbox. While the store cannot be reached the output can
	// be neither delivered nor kept: with hold, both are tried again, with
	// backoff, for as long as the agent's call may run, so an outage of the
	// store does not drop an answer to an event the router already took.
	push := func() error {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.r.cfg.OpTimeout)
		defer cancel()
		return o.r.outbox.Put(pctx, o.device, cmp.Or(o.share, dispatch.ShareAgent), out, 0)
	}
	for {
		err := push()
		if err == nil {
			break
		}
		if !o.hold || !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		o.r.log.WarnContext(ctx, "the output can be neither delivered nor kept; trying both again", "device", o.device, "err", err)
		if !wait.Wait(ctx) {
			return err
		}
		if got, err := o.r.sender.Send(ctx, out); err == nil && got == dispatch.Delivered {
			return nil // delivered after all
		}
	}
	o.r.outbox.Wake(ctx, o.device, out)
	return nil
}

func (o *output) Message(ctx context.Context, id, text string, edit, final bool) error {
	return o.send(ctx, wire.Output{Op: wire.OpMessage, ID: id, Text: text, Edit: edit, Final: final})
}

func (o *output) Media(ctx context.Context, m agent.Media) error {
	blob := m.Blob
	if blob == "" && len(m.Data) > 0 {
		if len(m.Data) > protocol.MaxMediaBytes {
			return errors.New("media is larger than " + protocol.MiB(protocol.MaxMediaBytes))
		}
		var err error
		if blob, err = o.r.store.PutBlobIn(ctx, tenant.OwnerOf(o.device), m.Data, o.r.cfg.BlobTTL); err != nil {
			return err
		}
	}
	id := m.ID
	if id == "" {
		id = ids.New("m")
	}
	return o.send(ctx, wire.Output{Op: wire.OpMedia, ID: id, Media: &wire.MediaRef{
		Kind: m.Kind, Mime: protocol.MimeOf(m.Mime, m.Filename), Filename: m.Filename, Caption: m.Caption,
		Size: len(m.Data), Blob: blob, URL: m.URL, ReplyTo: m.ReplyTo,
	}})
}

func (o *output) Prompt(ctx context.Context, p agent.Prompt) (string, error) {
	if !protocol.IsPromptKind(p.Kind) {
		return "", errors.New("unknown prompt kind " + p.Kind)
	}
	ttl := o.r.cfg.PromptTTL
	if p.TTL > 0 {
		ttl = min(p.TTL, o.r.cfg.PromptMaxTTL)
	}
	opts := protocol.PromptOptions(p.Kind, p.Choices)
	if len(p.Options) > 0 {
		var err error
		if opts, err = protocol.OfferOptions(p.Kind, p.Options); err != nil {
			return "", err
		}
	}
	card := protocol.Prompt{
		ID: ids.New("p"), Kind: p.Kind, Text: p.Text, Options: opts,
		Command: p.Command, Description: p.Description, Session: protocol.Session(tenant.DeviceID(o.device)), // the phone's own id
		TimeoutSeconds: int((ttl + time.Second - 1) / time.Second),
	}
	data, err := wire.Marshal(card)
	if err != nil {
		return "", err
	}
	rec := store.PromptRecord{ID: card.ID, Device: o.device, Kind: p.Kind, Choices: len(p.Choices),
		Expires: o.r.cfg.Clock.Now().Add(ttl), Data: data}
	if err := o.r.store.PutPrompt(ctx, rec); err != nil {
		return "", err
	}
	return card.ID, o.send(ctx, wire.Output{Op: wire.OpPrompt, Prompt: &card})
}

// ClosePrompt closes card id of the device before it is answered: the agent
// no longer waits for it. The device gets prompt_done{expired}; a later
// answer finds no card (prompt_done{expired} again) and reaches nobody.
// store.ErrNotFound when the card is gone (answered, expired, closed).
func (o *output) ClosePrompt(ctx context.Context, id string) error {
	rec, err := o.r.store.TakePrompt(ctx, id, o.device)
	if errors.Is(err, store.ErrForbidden) {
		return store.ErrNotFound // another device's card is not this session's to close
	}
	if err != nil {
		return err
	}
	done := wire.PromptDone{ID: rec.ID, OptionID: protocol.SafeOption(rec.Kind), Expired: true}
	return o.send(ctx, wire.Output{Op: wire.OpPromptDone, PromptDone: &done})
}

func (o *output) Typing(ctx context.Context, stop bool) error {
	return o.send(ctx, wire.Output{Op: wire.OpTyping, Stop: stop})
}

func (o *output) Avatar(ctx context.Context, state string) error {
	return o.send(ctx, wire.Output{Op: wire.OpAvatar, State: state})
}

func (o *output) Blob(ctx context.Context, key string) ([]byte, error) {
	return o.r.store.GetBlob(ctx, key)
}
