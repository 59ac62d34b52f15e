// Package dispatch sends an Output to the edge that owns its device: it
// reads the device's owner record from the store, stamps the output with
// its epoch and makes a request on the subject of the edge it names
// (bus.EdgeOutputSubject). That edge answers once the frames are written
// to the socket, or at once with what became of the device.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// DefaultTimeout bounds one delivery: the owning edge answers once the
// frames are written, so this is the edge's write timeout plus slack.
const DefaultTimeout = 15 * time.Second

// KeepMargin is what Send leaves of its caller's deadline, at most, for
// the caller to keep what no edge answered for in time: a request waits
// for its edge until a quarter of what is left of the caller's time, or
// KeepMargin, remains. A caller that keeps (a delivery with a ttl) gives
// Send DefaultTimeout plus KeepMargin.
const KeepMargin = 2 * time.Second

// Dispatcher delivers outputs to devices.
type Dispatcher struct {
	Owners  store.Owners
	Bus     bus.Bus
	Timeout time.Duration // per delivery; DefaultTimeout when zero
	Cache   *OwnerCache   // nil: every delivery reads its owner
	// Groups, when set, gathers Send's requests by edge: those that arrive
	// while one to their edge is in flight go together (Groups). nil: each
	// goes alone.
	Groups *Groups
}

// Send delivers out to out.Device and returns what became of it:
// Delivered once the phone has it, Written when it was written but not
// acknowledged in time (see wire.Output.WaitAck), Offline when no edge has
// the device, or Gone for media that no longer exists. The error is only
// the store's or the bus's failure.
func (d *Dispatcher) Send(ctx context.Context, out wire.Output) (Outcome, error) {
	// A device that moved between reading its owner and the request is
	// looked up again; a few rounds cover any realistic reconnect burst.
	// Every edge it was looked for at answering that it had moved on,
	// without writing it, is as good as offline (a ttl keeps it). One that
	// its group's batch did not settle goes again alone, as without Groups;
	// that round does not count.
	join := d.Groups != nil
	for n := 0; n < 4; {
		o, joined, err := d.send(ctx, out, join)
		if err != nil || o != moved {
			return o, err
		}
		if joined {
			join = false
			continue
		}
		n++
	}
	return Offline, nil
}

// Publish sends out to out.Device's edge without waiting for an answer:
// for moments (typing, avatar states), which are neither retried nor
// kept, so an agent does not wait a round trip for them. The owner it
// reads stays in the Cache for the outputs that follow. With epoch 0 the
// edge writes it to whatever socket of the device it holds. It reaches the
// edge before whatever this Dispatcher sends the device afterwards (NATS
// keeps the order of one connection's messages), so a typing indicator
// comes before the message. Nobody hears it when the device is offline.
func (d *Dispatcher) Publish(ctx context.Context, out wire.Output) error {
	owner, _, err := d.route(ctx, out)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil // offline
	case err != nil:
		return fmt.Errorf("owner of %q: %w", out.Device, err)
	}
	out.Epoch = 0
	data, err := wire.Marshal(out)
	if err != nil {
		return err
	}
	return d.Bus.Publish(ctx, outputSubject(owner), data, nil)
}

// Notify sends ctl to the edge that holds ctl.Device (its owner record,
// read now), without waiting, and on the device's subject, where an edge
// of a release before edge subjects hears it. Nobody hears it when the
// device is offline.
func (d *Dispatcher) Notify(ctx context.Context, ctl wire.Control) error {
	owner, _, err := d.owner(ctx, ctl.Device, true) // not the cache: the owner now
	switch {
	case errors.Is(err, store.ErrNotFound):
		owner = store.Owner{} // offline: the device's subject alone
	case err != nil:
		return fmt.Errorf("owner of %q: %w", ctl.Device, err)
	}
	// shim(v0.2.0): true: the device's subject, for an edge of the release
	// before edge subjects.
	return d.NotifyAt(ctx, owner, ctl, true)
}

// NotifyAt sends ctl to owner's edge (none when owner.Edge is empty), and,
// with alsoDevice, on ctl.Device's subject too, without waiting: for a
// sender that knows the owner already (an edge's takeover notice goes to
// the owner record its claim replaced). Both are tried; the error is
// theirs.
func (d *Dispatcher) NotifyAt(ctx context.Context, owner store.Owner, ctl wire.Control, alsoDevice bool) error {
	data, err := wire.Marshal(ctl)
	if err != nil {
		return err
	}
	var errs []error
	if owner.Edge != "" {
		errs = append(errs, d.Bus.Publish(ctx, outputSubject(owner), data, nil))
	}
	if alsoDevice { // shim(v0.2.0): an edge of the release before edge subjects.
		errs = append(errs, d.Bus.Publish(ctx, deviceSubject(ctl.Device), data, nil))
	}
	return errors.Join(errs...)
}

// send is one round of Send: the owner's read and the request to its edge,
// alone or (join) in its edge's group (joined).
func (d *Dispatcher) send(ctx context.Context, out wire.Output, join bool) (o Outcome, joined bool, err error) {
	owner, cached, err := d.route(ctx, out)
	defer func() {
		if err != nil || o != Delivered {
			d.Cache.drop(out.Device) // moved, offline, failed: read it again next time
		}
	}()
	switch {
	case errors.Is(err, store.ErrNotFound):
		// No record: the device is offline, or the store lost the record,
		// which the device's edge claims again within a heartbeat and
		// then reads the outbox, where the sender keeps what it could
		// not deliver.
		return Offline, false, nil
	case err != nil:
		return "", false, fmt.Errorf("owner of %q: %w", out.Device, err)
	}
	out.Epoch, out.Cached = owner.Epoch, cached
	data, err := wire.Marshal(out)
	if err != nil {
		return "", false, err
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if dl, ok := ctx.Deadline(); ok {
		// The edge's silence must be known while the caller can still
		// keep the output: its own deadline ending first made the answer
		// a bare "deadline exceeded", and nothing was kept.
		left := time.Until(dl)
		timeout = min(timeout, left-min(KeepMargin, left/4))
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	release := func() {}
	if join {
		if joined, release, o, err = d.join(ctx, rctx, owner.Edge, out, data); joined {
			return o, true, err
		}
	}
	if d.Groups != nil {
		d.Groups.m.alone()
	}
	reply, err := d.Bus.Request(rctx, outputSubject(owner), data, nil)
	release()
	if errors.Is(err, bus.ErrNoResponders) {
		// shim(v0.2.0): an edge of the release before edge subjects.
		//
		// The edge is gone, or is of a release before edge subjects,
		// which listens on the device's subject.
		reply, err = d.Bus.Request(rctx, deviceSubject(out.Device), data, nil)
	}
	noResponders := Offline
	if cached {
		noResponders = moved // the cached owner's edge is gone: read the owner again
	}
	if o, berr, ok := busOutcome(ctx, err, noResponders); ok {
		return o, false, berr
	}
	var r wire.Reply
	if err := wire.Unmarshal(reply, &r); err != nil {
		return "", false, fmt.Errorf("bad reply from edge: %w", err)
	}
	return Outcome(r.Result(out.WaitAck)), false, nil
}

// busOutcome is what a request's error err means for the outputs it
// carried (ok), or !ok when the edge answered: noResponders when no edge
// listens on the subject, Offline when the one asked did not answer in
// time (it died or lost the socket) while the caller (ctx) still waits,
// or else the bus's error.
func busOutcome(ctx context.Context, err error, noResponders Outcome) (o Outcome, _ error, ok bool) {
	switch {
	case err == nil:
		return "", nil, false
	case errors.Is(err, bus.ErrNoResponders):
		return noResponders, nil, true
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return Offline, nil, true
	}
	return "", err, true
}
