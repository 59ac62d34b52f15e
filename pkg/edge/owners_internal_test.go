package edge

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
)

// gatedOwners is a memstore whose DeviceOwners records each batch and, for
// the first one, holds its answer (already read) until open is closed.
type gatedOwners struct {
	*memstore.Store
	entered chan struct{} // closed when the first batch has been read
	open    chan struct{}
	fail    error // returned by the batches after the first

	mu      sync.Mutex
	batches [][]string
}

func (g *gatedOwners) DeviceOwners(ctx context.Context, devices []string) ([]store.Owner, error) {
	owners, err := g.Store.DeviceOwners(ctx, devices)
	g.mu.Lock()
	g.batches = append(g.batches, slices.Clone(devices))
	first := len(g.batches) == 1
	g.mu.Unlock()
	if first {
		close(g.entered)
		<-g.open
		return owners, err
	}
	if g.fail != nil {
		return nil, g.fail
	}
	return owners, err
}

func newGatedReads(t *testing.T) (*ownerReads, *gatedOwners, *sync.WaitGroup) {
	g := &gatedOwners{Store: memstore.New(memstore.Options{}), entered: make(chan struct{}), open: make(chan struct{})}
	var wg sync.WaitGroup
	r := newOwnerReads(t.Context(), g, time.Minute, func(f func()) { wg.Go(f) })
	t.Cleanup(wg.Wait)
	return r, g, &wg
}

// TestOwnerReadsBatchAfterAsking: reads asked for while a batch is in
// flight go in one next batch, which reads the store after they were
// asked: a claim made after the first batch was read is seen by the second.
func TestOwnerReadsBatchAfterAsking(t *testing.T) {
	r, g, wg := newGatedReads(t)
	ctx := t.Context()
	old, err := g.ClaimDevice(ctx, "a", "edge-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.ClaimDevice(ctx, "b", "edge-2", time.Minute); err != nil {
		t.Fatal(err)
	}
	results := make(map[string]<-chan ownerResult)
	read := func(key, device string) { results[key] = r.read(device) }
	read("a1", "a")
	<-g.entered // the first batch has read a's owner at epoch old
	newer, err := g.ClaimDevice(ctx, "a", "edge-3", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	read("b", "b")
	read("none", "never-claimed")
	read("a2", "a")
	close(g.open)
	wg.Wait()

	if got := (<-results["a1"]).owner; got != (store.Owner{Edge: "edge-1", Epoch: old}) {
		t.Errorf("first read of a = %+v, want edge-1 at %d", got, old)
	}
	if got := (<-results["a2"]).owner; got != (store.Owner{Edge: "edge-3", Epoch: newer}) {
		t.Errorf("read of a asked during the first batch = %+v, want the claim made meanwhile, edge-3 at %d", got, newer)
	}
	if got := <-results["b"]; got.err != nil || got.owner.Edge != "edge-2" {
		t.Errorf("read of b = %+v, %v", got.owner, got.err)
	}
	if got := <-results["none"]; !errors.Is(got.err, store.ErrNotFound) {
		t.Errorf("read of a device never claimed = %+v, %v; want ErrNotFound", got.owner, got.err)
	}
	if want := [][]string{{"a"}, {"b", "never-claimed", "a"}}; !slices.EqualFunc(g.batches, want, slices.Equal) {
		t.Errorf("batches = %q, want %q", g.batches, want)
	}
}

// TestOwnerReadsError: a failed batch fails every read in it, and the
// reads after it are sent again.
func TestOwnerReadsError(t *testing.T) {
	r, g, wg := newGatedReads(t)
	g.fail = errors.New("store away")
	x := r.read("x")
	<-g.entered
	y, z := r.read("y"), r.read("z")
	close(g.open)
	wg.Wait()
	if res := <-x; !errors.Is(res.err, store.ErrNotFound) {
		t.Errorf("first read = %v, want ErrNotFound", res.err)
	}
	for _, ch := range []<-chan ownerResult{y, z} {
		if res := <-ch; !errors.Is(res.err, g.fail) {
			t.Errorf("read in the failed batch = %v, want %v", res.err, g.fail)
		}
	}
	g.fail = nil
	got, err := r.get(t.Context(), "x")
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("read after the failure = %+v, %v; want a new batch answering ErrNotFound", got, err)
	}
}
