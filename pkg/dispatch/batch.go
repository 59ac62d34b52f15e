package dispatch

import (
	"context"
	"fmt"
	"sync"

	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// BatchResult is what became of one delivery of DeliverBatch: what
// Deliver returns for it (Err: the store's or the bus's failure).
type BatchResult struct {
	Delivery Delivery
	Err      error
}

// batchSlowWorkers bounds the devices whose deliveries DeliverBatch sends
// one by one (Deliver) at the same time.
const batchSlowWorkers = 64

// DeliverBatch delivers fs, each as Deliver would, and returns one result
// per delivery, in order; a delivery's failure does not stop the others.
// The deliveries of one device are sent in their order. A delivery without
// an id gets one made here (fs[i].ID is set to it).
//
// The texts (of the deliveries before a device's first file) go in one
// request per edge: the owners of all devices are read in one store round
// trip, and each edge gets a wire.Batch of the outputs for the devices it
// holds. What that request does not see written (a device that moved, went
// offline or has no owner record, an edge that did not answer or is of a
// release before batches, which does not subscribe to its subject) and
// every delivery with a file is sent alone by Deliver, so every answer but
// "the phone has it" and "written, not acknowledged" (without a ttl) is
// Deliver's own: with a ttl, Deliver keeps what the batch did not deliver.
//
// With a Tracer, each delivery's part of an edge's request is a
// router.deliver span of its own, a child of ctx's span (the request's),
// and the edge's edge.deliver of it is that span's child
// (wire.Output.TraceParent); one sent alone afterwards gets one more, as
// Deliver's are.
func (d *Deliverer) DeliverBatch(ctx context.Context, fs []*protocol.Deliver) []BatchResult {
	return d.DeliverBatchAs(ctx, tenant.Legacy, fs)
}

// DeliverBatchAs is DeliverBatch of fs sent with a credential of owner:
// every target is a device of owner (TargetOf).
func (d *Deliverer) DeliverBatchAs(ctx context.Context, owner string, fs []*protocol.Deliver) []BatchResult {
	res := make([]BatchResult, len(fs))
	settled := make([]bool, len(fs))
	byDevice := make(map[string][]int)
	var devices []string
	for i, f := range fs {
		if f.ID == "" {
			f.ID = ids.New("d")
		}
		res[i].Delivery = Delivery{ID: f.ID, Outcome: Delivered}
		dev, e := d.TargetOf(owner, f)
		res[i].Delivery.Device = dev
		if e == nil {
			e = d.checkTTL(f.TTL)
		}
		if e != nil {
			res[i].Delivery.refuse(e)
			settled[i] = true
			continue
		}
		if _, ok := byDevice[dev]; !ok {
			devices = append(devices, dev)
		}
		byDevice[dev] = append(byDevice[dev], i)
	}
	d.sendTexts(ctx, fs, res, settled, devices, byDevice)

	// The rest, one by one: in order per device, devices side by side.
	sem := make(chan struct{}, batchSlowWorkers)
	var wg sync.WaitGroup
	for _, dev := range devices {
		var rest []int
		for _, i := range byDevice[dev] {
			if !settled[i] {
				rest = append(rest, i)
			}
		}
		if len(rest) == 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, i := range rest {
				res[i].Delivery, res[i].Err = d.DeliverAs(ctx, owner, fs[i])
			}
		}()
	}
	wg.Wait()
	return res
}

// sendTexts sends, per edge in one request, the text-only deliveries that
// come before each device's first file, and settles those the edge wrote
// (delivered, or, without a ttl, written and not acknowledged in time).
// Any other answer leaves the delivery to Deliver, which decides what
// becomes of it.
func (d *Deliverer) sendTexts(ctx context.Context, fs []*protocol.Deliver, res []BatchResult, settled []bool, devices []string, byDevice map[string][]int) {
	owners, err := d.Dispatcher.owners(ctx, devices)
	if err != nil {
		return // Deliver reads them again, and answers the store's error
	}
	type item struct {
		i   int
		out wire.Output
	}
	byEdge := make(map[string][]item)
	traced := 0 // what each output's traceparent adds to its size
	if d.Tracer != nil {
		traced = tracedOutputSize
	}
	for k, dev := range devices {
		o := owners[k]
		if o.Epoch == 0 {
			continue // no owner record: Deliver finds out
		}
		for _, i := range byDevice[dev] {
			if fs[i].Media != nil {
				break // a file, and what follows it, goes alone, in order
			}
			out := messageOutput(res[i].Delivery, fs[i])
			out.Epoch = o.Epoch
			byEdge[o.Edge] = append(byEdge[o.Edge], item{i, out})
		}
	}
	var wg sync.WaitGroup
	for edge, items := range byEdge {
		// Cut into requests of at most wire.MaxBatchBytes.
		for len(items) > 0 {
			n, size := 0, 0
			for n < len(items) && (n == 0 || size+outputSize(items[n].out)+traced <= wire.MaxBatchBytes) {
				size += outputSize(items[n].out) + traced
				n++
			}
			part := items[:n]
			items = items[n:]
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs := make([]wire.Output, len(part))
				ends := make([]func(error), len(part))
				for k, it := range part {
					outs[k] = it.out
					sctx, end := d.span(ctx, it.out.Op)
					ends[k] = end
					if d.Tracer != nil {
						// One bus message carries them all: each names
						// its own span for the edge.
						outs[k].TraceParent = telemetry.TraceParent(sctx)
					}
				}
				outcomes, err := d.Dispatcher.sendBatch(ctx, edge, outs)
				for k, it := range part {
					var o Outcome
					if err == nil {
						o = outcomes[k]
					}
					ends[k](deliverySpanErr(o, err))
					if o != Delivered && (o != Written || fs[it.i].TTL > 0) {
						// Deliver sends it again alone and says what
						// became of it (with a ttl: kept, if the phone
						// does not take it then either).
						continue
					}
					res[it.i].Err = res[it.i].Delivery.settle(o)
					settled[it.i] = true
				}
			}()
		}
	}
	wg.Wait()
}

// tracedOutputSize is what an output's traceparent adds to its encoding:
// ,"traceparent":"00-<32 hex>-<16 hex>-<2 hex>".
const tracedOutputSize = len(`,"traceparent":""`) + 55

// outputSize estimates the encoded size of a text output.
func outputSize(out wire.Output) int {
	return len(out.Text) + len(out.ID) + len(out.Device) + 96
}

// sendBatch sends outs, each stamped with its device's epoch, to edge in
// one wire.Batch, and returns what Send's one round would for each: moved
// for one to send again on its device's subject. The error, the bus's
// failure or an edge's unreadable answer, is every output's.
func (d *Dispatcher) sendBatch(ctx context.Context, edge string, outs []wire.Output) (outcomes []Outcome, err error) {
	outcomes = make([]Outcome, len(outs))
	defer func() {
		for i, o := range outcomes {
			if err != nil || o != Delivered {
				d.Cache.drop(outs[i].Device)
			}
		}
	}()
	data, err := wire.Marshal(wire.Batch{Outputs: outs})
	if err != nil {
		return outcomes, err
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := d.Bus.Request(rctx, batchSubject(edge), data, nil)
	// shim(v0.2.0): no responders is an edge of the release before
	// batches (or one that is gone): each output goes on its device's
	// subject (moved).
	if o, berr, ok := busOutcome(ctx, err, moved); ok {
		for i := range outcomes {
			outcomes[i] = o
		}
		return outcomes, berr
	}
	var r wire.BatchReply
	if err := wire.Unmarshal(reply, &r); err != nil {
		return outcomes, fmt.Errorf("bad reply from edge: %w", err)
	}
	if len(r.Replies) != len(outs) {
		return outcomes, fmt.Errorf("bad reply from edge: %d answers to %d outputs", len(r.Replies), len(outs))
	}
	for i, rep := range r.Replies {
		outcomes[i] = Outcome(rep.Result(outs[i].WaitAck))
	}
	return outcomes, nil
}
