package edge

import (
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// maxOwnerBatch bounds the devices of one store round trip of ownerReads.
const maxOwnerBatch = 1024

// ownerReads reads device owners for the delivery fence (fenceOwner) and
// the hello's second look, in batches: a read asked for while a batch is in
// flight waits for the next one, sent as soon as the first is answered with
// every device asked for meanwhile, in one store round trip. Every read
// therefore starts after it was asked for, which both callers need (the
// owner as it is when a delivery arrived or a subscription was made, or
// later), and under load an edge makes one round trip per batch instead of
// one per delivery.
type ownerReads struct {
	store   store.Owners
	ctx     context.Context // the server's: reads end with it
	timeout time.Duration   // per batch
	run     func(func())    // starts a tracked goroutine

	mu      sync.Mutex
	busy    bool // a goroutine is sending batches
	pending []ownerRead
}

type ownerRead struct {
	device string
	done   func(store.Owner, error) // called once, on the batch's goroutine; must not block
}

// read looks device's owner up and calls done with it, or with
// store.ErrNotFound when it has none.
func (r *ownerReads) read(device string, done func(store.Owner, error)) {
	r.mu.Lock()
	r.pending = append(r.pending, ownerRead{device, done})
	if r.busy {
		r.mu.Unlock()
		return
	}
	r.busy = true
	r.mu.Unlock()
	r.run(r.send)
}

// get is read that waits for the answer, or for ctx.
func (r *ownerReads) get(ctx context.Context, device string) (store.Owner, error) {
	type result struct {
		owner store.Owner
		err   error
	}
	got := make(chan result, 1)
	r.read(device, func(o store.Owner, err error) { got <- result{o, err} })
	select {
	case res := <-got:
		return res.owner, res.err
	case <-ctx.Done():
		return store.Owner{}, ctx.Err()
	}
}

// send sends batches until nothing is pending.
func (r *ownerReads) send() {
	for {
		r.mu.Lock()
		batch := r.pending
		if len(batch) > maxOwnerBatch {
			batch = batch[:maxOwnerBatch:maxOwnerBatch]
			r.pending = r.pending[maxOwnerBatch:]
		} else {
			r.pending = nil
		}
		if len(batch) == 0 {
			r.busy = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		devices := make([]string, len(batch))
		for i, b := range batch {
			devices[i] = b.device
		}
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		owners, err := r.store.DeviceOwners(ctx, devices)
		cancel()
		for i, b := range batch {
			switch {
			case err != nil:
				b.done(store.Owner{}, err)
			case owners[i].Epoch == 0:
				b.done(store.Owner{}, store.ErrNotFound)
			default:
				b.done(owners[i], nil)
			}
		}
	}
}
