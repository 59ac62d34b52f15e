package edge

import (
	"context"
	"time"

	"github.com/hermes-mobile/gateway/internal/batch"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// maxOwnerBatch bounds the devices of one store round trip of ownerReads.
const maxOwnerBatch = 1024

// ownerReads reads device owners for the delivery fence (fenceOwner) and
// the hello's second look, in groups (package batch): every read starts
// after it was asked for, which both callers need (the owner as it is when
// a delivery arrived or a subscription was made, or later), and under load
// an edge makes one store round trip per group instead of one per delivery.
type ownerReads struct {
	b batch.Batcher[string, ownerResult]
}

type ownerResult struct {
	owner store.Owner
	err   error
}

// newOwnerReads reads from st, each group within timeout of ctx; run
// starts the groups' goroutine.
func newOwnerReads(ctx context.Context, st store.Owners, timeout time.Duration, run func(func())) *ownerReads {
	return &ownerReads{b: batch.Batcher[string, ownerResult]{Max: maxOwnerBatch, Go: run, Run: func(devices []string) []ownerResult {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		owners, err := st.DeviceOwners(ctx, devices)
		res := make([]ownerResult, len(devices))
		for i := range res {
			switch {
			case err != nil:
				res[i].err = err
			case owners[i].Epoch == 0:
				res[i].err = store.ErrNotFound
			default:
				res[i].owner = owners[i]
			}
		}
		return res
	}}}
}

// read looks device's owner up; the channel gets it, or store.ErrNotFound
// when it has none.
func (r *ownerReads) read(device string) <-chan ownerResult {
	got := make(chan ownerResult, 1)
	r.b.Add(device, func(res ownerResult) { got <- res })
	return got
}

// get is read that waits for the answer, or for ctx.
func (r *ownerReads) get(ctx context.Context, device string) (store.Owner, error) {
	select {
	case res := <-r.read(device):
		return res.owner, res.err
	case <-ctx.Done():
		return store.Owner{}, ctx.Err()
	}
}
