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

// ErrOffline: no edge holds the device, or the one that did could not write.
var ErrOffline = errors.New("device offline")

// ErrNotAcked: the frames were written, but the phone, which acknowledges
// what it displays, did not acknowledge them in time: it may not have them.
// It wraps ErrOffline, so a sender that keeps what did not get there keeps
// it.
var ErrNotAcked = fmt.Errorf("%w: written, but not acknowledged by the phone", ErrOffline)

// ErrGone: the output refers to media that no longer exists in the store.
var ErrGone = errors.New("media no longer exists")

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
}

// Send delivers out to out.Device. It returns nil once the phone has it
// (wire.OutcomeDelivered), ErrNotAcked when it was written but not
// acknowledged in time (wire.OutcomeWritten; see wire.Output.WaitAck),
// ErrOffline when no edge has the device, ErrGone for media that no
// longer exists, or another error when the store or the bus failed.
func (d *Dispatcher) Send(ctx context.Context, out wire.Output) (err error) {
	// A device that moved between reading its owner and the request is
	// looked up again; a few rounds cover any realistic reconnect burst.
	for range 3 {
		if err = d.send(ctx, out); !errors.Is(err, errMoved) {
			return err
		}
	}
	if err = d.send(ctx, out); errors.Is(err, errMoved) {
		// Every edge it was looked for at answered that it had moved on,
		// without writing it: as good as offline now (a ttl keeps it).
		return fmt.Errorf("%w: %q kept moving between edges", ErrOffline, out.Device)
	}
	return err
}

var errMoved = errors.New("device moved")

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
	return d.Bus.Publish(ctx, bus.EdgeOutputSubject(owner.Edge), data, nil)
}

// Notify sends ctl to the edge that holds ctl.Device (its owner record,
// read now), without waiting, and on the device's subject, where an edge
// of a release before edge subjects hears it. Nobody hears it when the
// device is offline.
func (d *Dispatcher) Notify(ctx context.Context, ctl wire.Control) error {
	data, err := wire.Marshal(ctl)
	if err != nil {
		return err
	}
	owner, err := d.Owners.DeviceOwner(ctx, ctl.Device) // not the cache: the owner now
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return fmt.Errorf("owner of %q: %w", ctl.Device, err)
	default:
		if err := d.Bus.Publish(ctx, bus.EdgeOutputSubject(owner.Edge), data, nil); err != nil {
			return err
		}
	}
	// shim(v0.2.0): an edge of the release before edge subjects.
	return d.Bus.Publish(ctx, bus.DeviceSubject(ctl.Device), data, nil)
}

// route returns the owner out goes to: the device's owner record (from
// the Cache while fresh), or, when there is none but out.Via names the
// edge the device's event just came through, that edge at epoch 0. The
// store may have lost the record (a Redis restart): epoch 0 has that edge
// write out to whatever socket of the device it holds (and claim the
// device again); none there is offline. store.ErrNotFound when neither.
func (d *Dispatcher) route(ctx context.Context, out wire.Output) (o store.Owner, cached bool, err error) {
	o, cached, err = d.owner(ctx, out.Device)
	if errors.Is(err, store.ErrNotFound) && out.Via != "" {
		return store.Owner{Edge: out.Via}, false, nil
	}
	return o, cached, err
}

func (d *Dispatcher) send(ctx context.Context, out wire.Output) (err error) {
	owner, cached, err := d.route(ctx, out)
	defer func() {
		if err != nil {
			d.Cache.drop(out.Device) // moved, offline, failed: read it again next time
		}
	}()
	switch {
	case errors.Is(err, store.ErrNotFound):
		// No record: the device is offline, or the store lost the record,
		// which the device's edge claims again within a heartbeat and
		// then reads the outbox, where the sender keeps what it could
		// not deliver.
		return fmt.Errorf("%w: no owner record for %q", ErrOffline, out.Device)
	case err != nil:
		return fmt.Errorf("owner of %q: %w", out.Device, err)
	}
	out.Epoch, out.Cached = owner.Epoch, cached
	data, err := wire.Marshal(out)
	if err != nil {
		return err
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
	reply, err := d.Bus.Request(rctx, bus.EdgeOutputSubject(owner.Edge), data, nil)
	if errors.Is(err, bus.ErrNoResponders) {
		// shim(v0.2.0): an edge of the release before edge subjects.
		//
		// The edge is gone, or is of a release before edge subjects,
		// which listens on the device's subject.
		reply, err = d.Bus.Request(rctx, bus.DeviceSubject(out.Device), data, nil)
	}
	switch {
	case errors.Is(err, bus.ErrNoResponders) && cached:
		return errMoved // the cached owner's edge is gone: read the owner again
	case errors.Is(err, bus.ErrNoResponders):
		return ErrOffline
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		// The recorded owner did not answer: it died or lost the socket.
		return fmt.Errorf("%w: no edge answered for %q", ErrOffline, out.Device)
	case err != nil:
		return err
	}
	var r wire.Reply
	if err := wire.Unmarshal(reply, &r); err != nil {
		return fmt.Errorf("bad reply from edge: %w", err)
	}
	return replyErr(r, out.WaitAck)
}

// replyErr is what Send returns for an edge's answer r to an Output (its
// WaitAck is waitAck), or errMoved to look the owner up again.
func replyErr(r wire.Reply, waitAck bool) error {
	switch r.Result(waitAck) {
	case wire.OutcomeDelivered:
		return nil
	case wire.OutcomeWritten:
		return ErrNotAcked
	case wire.OutcomeMoved:
		return errMoved
	case wire.OutcomeGone:
		return fmt.Errorf("%w: %s", ErrGone, r.Error)
	}
	return fmt.Errorf("%w: %s", ErrOffline, r.Error)
}
