package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
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
}

// Delivery is what an edge did with a delivery.
type Delivery struct {
	ID     string // the deliver's id, or the one made for it
	Device string // the device its target names
	// Outcome is wire.OutcomeDelivered (the phone has it: acknowledged,
	// or written to a phone that does not ack and no "wait":"ack") or
	// wire.OutcomeWritten (written, not acknowledged in time: it may not
	// have it). Deliver returns no Delivery with another outcome.
	Outcome wire.Outcome
}

// Target returns the device f is for: its target, or the home device.
// The error is a *protocol.Error (bad_frame).
func (d *Deliverer) Target(f *protocol.Deliver) (string, error) {
	device, e := protocol.DeliverTarget(f.Target, d.HomeDevice)
	if e != nil {
		return "", e
	}
	return device, nil
}

// Deliver sends f to the device online now: its text first, then its
// file. Nothing is kept for a device that is not online, and a file is
// stored only for a device that is (its owner record, or the text that
// just reached it, says so). It returns the Delivery, or ErrOffline (no
// edge holds the device), a *protocol.Error (a target naming no device),
// or the store's or the bus's error. The Delivery's ID and Device are set
// whatever the error.
func (d *Deliverer) Deliver(ctx context.Context, f *protocol.Deliver) (Delivery, error) {
	dl := Delivery{ID: f.ID, Outcome: wire.OutcomeDelivered}
	if dl.ID == "" {
		dl.ID = ids.New("d")
	}
	var err error
	if dl.Device, err = d.Target(f); err != nil {
		return dl, err
	}
	reached := false // an edge wrote something of f to the device
	if f.Text != "" {
		if err := d.send(ctx, &dl, messageOutput(dl, f)); err != nil {
			return dl, err
		}
		reached = true
	}
	if m := f.Media; m != nil {
		if !reached {
			// Do not keep up to 8 MiB for a device that has no owner
			// record. (Right after a Redis restart a connected device may
			// lack one until its edge's next heartbeat: cron is told to
			// retry, which it would be told anyway while Redis is away.)
			if _, _, err := d.Dispatcher.owner(ctx, dl.Device); errors.Is(err, store.ErrNotFound) {
				return dl, ErrOffline
			} else if err != nil {
				return dl, err
			}
		}
		key, err := d.Blobs.PutBlob(ctx, m.Data, d.BlobTTL)
		if err != nil {
			return dl, err
		}
		if err := d.send(ctx, &dl, wire.Output{Op: wire.OpMedia, Device: dl.Device, ID: dl.ID + "-media", WaitAck: f.WaitAck, Media: &wire.MediaRef{
			Kind: m.Kind, Mime: m.Mime, Filename: m.Filename, Size: len(m.Data), Blob: key,
		}}); err != nil {
			return dl, err
		}
	}
	return dl, nil
}

// send sends one output of a delivery; one written but not acknowledged
// makes the whole delivery written.
func (d *Deliverer) send(ctx context.Context, dl *Delivery, out wire.Output) error {
	return dl.settle(d.Dispatcher.Send(ctx, out))
}

// messageOutput is the output of f's text, for dl's device.
func messageOutput(dl Delivery, f *protocol.Deliver) wire.Output {
	return wire.Output{Op: wire.OpMessage, Device: dl.Device, ID: dl.ID, Text: f.Text, Final: true, WaitAck: f.WaitAck}
}

// settle takes the answer err to one output of dl: written but not
// acknowledged makes the whole delivery written.
func (dl *Delivery) settle(err error) error {
	if errors.Is(err, ErrNotAcked) {
		dl.Outcome = wire.OutcomeWritten
		return nil
	}
	return err
}
