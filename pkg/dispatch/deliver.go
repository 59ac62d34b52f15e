package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Deliverer carries out cron's deliveries: the edge's deliver frame and
// the router's POST /v1/deliver both decode into a protocol.DeliverBody,
// validate it with its Frame and hand the result to Deliver, so a
// delivery means the same on both surfaces.
type Deliverer struct {
	Dispatcher *Dispatcher
	Blobs      store.Blobs
	BlobTTL    time.Duration // how long a delivered file is kept for the edge
	HomeDevice string        // the target of a deliver without one (MOBILE_HOME_DEVICE)
	// Outbox keeps a delivery with a ttl that the device cannot take now;
	// nil: a ttl is refused (bad_frame).
	Outbox *Outbox
	// Tracer, when set, records a router.deliver span (SpanDeliver) for
	// each output sent to a device's edge (and kept, with a ttl), under the
	// span of the caller's context; the edge's edge.deliver continues it
	// across the bus. nil: no spans, at no cost.
	Tracer trace.Tracer
}

// SpanDeliver names the span of one output's delivery, as the router's
// own deliveries (the agent's answers) name theirs.
const SpanDeliver = "router.deliver"

// span starts the SpanDeliver span of one output of op under ctx's span,
// when d has a Tracer, and returns the function that ends it with the
// delivery's error.
func (d *Deliverer) span(ctx context.Context, op string) (context.Context, func(error)) {
	if d.Tracer == nil {
		return ctx, noEnd
	}
	ctx, span := d.Tracer.Start(ctx, SpanDeliver, trace.WithAttributes(attribute.String("hermes.kind", op)))
	return ctx, func(err error) { telemetry.EndSpan(span, err) }
}

func noEnd(error) {}

// Delivery is what became of a delivery.
type Delivery struct {
	ID string // the deliver's id, or the one made for it
	// Device is the device key its target names (tenant.DeviceKey; empty
	// when the target was refused).
	Device string
	// Outcome is Delivered (the phone has it: acknowledged, or written to
	// a phone that does not ack and no "wait":"ack"), Written (written,
	// not acknowledged in time: it may not have it), Queued (with a ttl:
	// (a part of) it did not reach the device and is kept in its outbox
	// for the ttl), Offline (no edge holds the device and no ttl: nothing
	// is kept) or Refused (Refusal says why).
	Outcome Outcome
	// Refusal is why a Refused deliver is refused (bad_frame).
	Refusal *protocol.Error
}

// refuse makes dl Refused for e.
func (dl *Delivery) refuse(e *protocol.Error) {
	dl.Outcome, dl.Refusal = Refused, e
}

// DeviceID is the device id of dl's target as the sender named it (never
// the device key); empty when the target was refused.
func (dl Delivery) DeviceID() string { return tenant.DeviceID(dl.Device) }

// Target returns the device f is for: its target, or the home device, or
// why f names none (bad_frame). It is the legacy owner's: TargetOf.
func (d *Deliverer) Target(f *protocol.Deliver) (string, *protocol.Error) {
	return d.TargetOf(tenant.Legacy, f)
}

// TargetOf returns the device key (tenant.DeviceKey) of the device f is
// for, sent with a credential of owner: its target, or (for the legacy
// owner) the home device, or why f names none (bad_frame). A target names
// a device of the sender's owner only.
func (d *Deliverer) TargetOf(owner string, f *protocol.Deliver) (string, *protocol.Error) {
	home := ""
	if owner == tenant.Legacy {
		home = d.HomeDevice // MOBILE_HOME_DEVICE is the legacy owner's
	}
	dev, e := protocol.DeliverTarget(f.Target, home)
	if e != nil {
		return "", e
	}
	key, err := tenant.Scope(owner, dev)
	if err != nil {
		return "", protocol.NewError(protocol.CodeBadFrame, "deliver target: "+err.Error())
	}
	return key, nil
}

// Deliver sends f to the device online now: its text first, then its
// file. Without a ttl nothing is kept for a device that is not online, and
// a file is stored only for a device that is (its owner record, or the
// text that just reached it, says so). With a ttl (f.TTL, at most the
// Outbox's MaxTTL) what does not reach the device, or is written but not
// acknowledged in time, is kept in its outbox for the ttl (Queued), and
// once a part is kept the parts after it are kept too, so they reach the
// phone in order. It returns the Delivery, whose Outcome says what became
// of f; the error is only the store's or the bus's failure. The Delivery's
// ID and Device are set whatever the error.
func (d *Deliverer) Deliver(ctx context.Context, f *protocol.Deliver) (Delivery, error) {
	return d.DeliverAs(ctx, tenant.Legacy, f)
}

// DeliverAs is Deliver of f sent with a credential of owner: its target
// is a device of owner (TargetOf).
func (d *Deliverer) DeliverAs(ctx context.Context, owner string, f *protocol.Deliver) (Delivery, error) {
	dl := Delivery{ID: f.ID, Outcome: Delivered}
	if dl.ID == "" {
		dl.ID = ids.New("d")
	}
	var e *protocol.Error
	if dl.Device, e = d.TargetOf(owner, f); e == nil {
		e = d.checkTTL(f.TTL)
	}
	if e != nil {
		dl.refuse(e)
		return dl, nil
	}
	reached := false // an edge wrote something of f to the device
	if f.Text != "" {
		if err := d.send(ctx, &dl, f, messageOutput(dl, f)); err != nil || dl.Outcome == Offline {
			return dl, err
		}
		reached = dl.Outcome != Queued
	}
	if m := f.Media; m != nil {
		if !reached && dl.Outcome != Queued {
			// Do not keep up to 8 MiB for a device that has no owner
			// record, unless asked to (a ttl). (Right after a Redis
			// restart a connected device may lack one until its edge's
			// next heartbeat: cron is told to retry, which it would be
			// told anyway while Redis is away.)
			if _, _, err := d.Dispatcher.owner(ctx, dl.Device, false); errors.Is(err, store.ErrNotFound) {
				if f.TTL <= 0 {
					dl.Outcome = Offline
					return dl, nil
				}
				dl.Outcome = Queued // nobody to send it to: straight to the outbox
			} else if err != nil {
				return dl, err
			}
		}
		key, err := d.Blobs.PutBlobIn(ctx, tenant.OwnerOf(dl.Device), m.Data, d.BlobTTL)
		if err != nil {
			return dl, err
		}
		if err := d.send(ctx, &dl, f, wire.Output{Op: wire.OpMedia, Device: dl.Device, ID: dl.ID + "-media", WaitAck: f.WaitAck, Media: &wire.MediaRef{
			Kind: m.Kind, Mime: m.Mime, Filename: m.Filename, Size: len(m.Data), Blob: key,
		}}); err != nil {
			return dl, err
		}
	}
	return dl, nil
}

// messageOutput is the output of f's text, for dl's device.
func messageOutput(dl Delivery, f *protocol.Deliver) wire.Output {
	return wire.Output{Op: wire.OpMessage, Device: dl.Device, ID: dl.ID, Text: f.Text, Final: true, WaitAck: f.WaitAck}
}

// settle makes o, what became of one output of dl sent to the device
// (Send's answer), dl's outcome: written but not acknowledged makes the
// whole delivery written; offline (no ttl) makes it offline. Media gone
// from the store right after it was stored there is the store's failure.
func (dl *Delivery) settle(o Outcome) error {
	switch o {
	case Written, Offline:
		dl.Outcome = o
	case Gone:
		return fmt.Errorf("%w: the file of delivery %s", ErrGone, dl.ID)
	}
	return nil
}

// checkTTL refuses a ttl this Deliverer cannot keep for.
func (d *Deliverer) checkTTL(ttl time.Duration) *protocol.Error {
	switch {
	case ttl <= 0:
		return nil
	case d.Outbox == nil:
		return protocol.NewError(protocol.CodeBadFrame, "deliver ttl: this gateway keeps no deliveries")
	case ttl > d.Outbox.MaxTTL():
		return protocol.NewError(protocol.CodeBadFrame, fmt.Sprintf("deliver ttl is at most %d seconds (MOBILE_OUTBOX_TTL), not %d",
			int64(d.Outbox.MaxTTL()/time.Second), int64(ttl/time.Second)))
	}
	return nil
}

// send sends one output of f: to the device, or (f has a ttl, and the
// device did not take it or an earlier part was kept) to its outbox.
func (d *Deliverer) send(ctx context.Context, dl *Delivery, f *protocol.Deliver, out wire.Output) (err error) {
	ctx, end := d.span(ctx, out.Op)
	o := Queued
	defer func() { end(deliverySpanErr(o, err)) }()
	if dl.Outcome != Queued {
		if o, err = d.Dispatcher.Send(ctx, out); err != nil {
			return err
		}
		if f.TTL <= 0 || o == Delivered || o == Gone {
			return dl.settle(o)
		}
		// Offline, or written and not acknowledged: kept, and sent again
		// on the next connection (at least once; the app replaces a
		// message by id).
		o, dl.Outcome = Queued, Queued
	}
	out.WaitAck = false
	return d.Outbox.Keep(ctx, dl.Device, out, f.TTL)
}

// deliverySpanErr is the status of the span of one output of a delivery:
// SpanErr, but written and not acknowledged is the delivery's outcome, not
// a failure.
func deliverySpanErr(o Outcome, err error) error {
	if o == Written {
		o = Delivered
	}
	return SpanErr(o, err)
}
