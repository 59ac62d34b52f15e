package dispatch_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// countingOwners counts the owner reads that reach the store.
type countingOwners struct {
	store.Owners
	reads atomic.Int32
}

func (c *countingOwners) DeviceOwner(ctx context.Context, device string) (store.Owner, error) {
	c.reads.Add(1)
	return c.Owners.DeviceOwner(ctx, device)
}

// edgeAt answers deliveries to device as an edge holding it at epoch does
// (pkg/edge's onDelivery): delivered at its epoch, moved for an older one,
// moved once its socket closed (a late message of its subscription). It
// returns the epoch of the last delivery it wrote and its subscription.
func edgeAt(t *testing.T, b bus.Bus, device string, epoch int64) (*atomic.Int64, bus.Subscription) {
	t.Helper()
	var wrote atomic.Int64
	sub, err := b.Subscribe(bus.DeviceSubject(device), func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Error(err)
			return
		}
		r := wire.Reply{OK: true}
		if out.Epoch < epoch || m.Late {
			r = wire.Reply{Moved: true, Error: "device moved"}
		} else {
			wrote.Store(out.Epoch)
		}
		data, _ := json.Marshal(r)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &wrote, sub
}

// cacheDeps is an in-memory store and an embedded bus, closed with t.
func cacheDeps(t *testing.T) (*memstore.Store, bus.Bus) {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Embedded(natsbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return st, b
}

// spyCached says, for each request to device's subject, whether its epoch
// came from the sender's owner cache, until its subscription ends.
func spyCached(t *testing.T, b bus.Bus, device string) (<-chan bool, bus.Subscription) {
	t.Helper()
	cached := make(chan bool, 16)
	spy, err := b.Subscribe(bus.DeviceSubject(device), func(m *bus.Msg) {
		var out wire.Output
		if err := json.Unmarshal(m.Data, &out); err != nil {
			t.Error(err)
		}
		cached <- out.Cached
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spy.Unsubscribe() })
	return cached, spy
}

// TestOwnerCache: the outputs of one answer read the owner once, and the
// requests stamped from the cache say so (for the edge to confirm); a cached
// owner that is stale is fenced by the edge ("moved") and read again, so
// the output reaches the new socket at its epoch; past the TTL the owner
// is read again.
func TestOwnerCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, b := cacheDeps(t)
	owners := &countingOwners{Owners: st}
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	d := &dispatch.Dispatcher{Owners: owners, Bus: b, Cache: &dispatch.OwnerCache{Clock: clk}}

	e1, err := st.ClaimDevice(ctx, "tel-1", "edge-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	first, firstSub := edgeAt(t, b, "tel-1", e1)
	cached, spy := spyCached(t, b, "tel-1")
	for i := range 5 {
		if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m", Text: "part"}); err != nil || o != dispatch.Delivered {
			t.Fatalf("send %d: %s, %v", i, o, err)
		}
	}
	if n := owners.reads.Load(); n != 1 {
		t.Fatalf("5 outputs read the owner %d times, want 1", n)
	}
	if got := first.Load(); got != e1 {
		t.Fatalf("delivered at epoch %d, want %d", got, e1)
	}
	for i := range 5 {
		select {
		case c := <-cached:
			if c != (i > 0) {
				t.Errorf("output %d marked cached %v, want %v (only the first read the store)", i, c, i > 0)
			}
		case <-ctx.Done():
			t.Fatalf("output %d: not seen on the bus", i)
		}
	}
	if err := spy.Unsubscribe(); err != nil {
		t.Fatal(err)
	}

	// The device moves to another edge: the cached epoch is stale.
	e2, err := st.ClaimDevice(ctx, "tel-1", "edge-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	second, _ := edgeAt(t, b, "tel-1", e2)
	if err := firstSub.Unsubscribe(); err != nil { // the old socket closed
		t.Fatal(err)
	}
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m2", Text: "after the move"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("send after the move: %s, %v", o, err)
	}
	if got := second.Load(); got != e2 {
		t.Fatalf("after the move delivered at epoch %d, want the new socket's %d", got, e2)
	}
	if n := owners.reads.Load(); n != 2 {
		t.Fatalf("owner read %d times after the move, want 2 (the stale entry read again once)", n)
	}

	// Within the TTL the new owner is cached; at the TTL it is read again.
	clk.Advance(dispatch.OwnerCacheTTL - time.Nanosecond)
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m3", Text: "cached"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("Send = %s, %v; want delivered", o, err)
	}
	if n := owners.reads.Load(); n != 2 {
		t.Fatalf("owner read %d times within the TTL, want 2", n)
	}
	clk.Advance(time.Nanosecond)
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m4", Text: "expired"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("Send = %s, %v; want delivered", o, err)
	}
	if n := owners.reads.Load(); n != 3 {
		t.Fatalf("owner read %d times at the TTL, want 3", n)
	}
}

// TestOwnerCacheSeed: an owner seeded from an event's socket (its edge and
// epoch) serves the answer's outputs without a read, marked cached for the
// edge to fence; a seed older than the device's socket is fenced ("moved")
// and the owner read again; a seed never replaces a fresher entry of a
// later epoch, and one of epoch 0 (an edge that did not say) is no seed.
func TestOwnerCacheSeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, b := cacheDeps(t)
	owners := &countingOwners{Owners: st}
	cache := &dispatch.OwnerCache{Clock: clock.NewFake(time.Unix(1_000_000, 0))}
	d := &dispatch.Dispatcher{Owners: owners, Bus: b, Cache: cache}

	e1, err := st.ClaimDevice(ctx, "tel-1", "edge-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wrote, sub := edgeAt(t, b, "tel-1", e1)
	cached, spy := spyCached(t, b, "tel-1")

	cache.Seed("tel-1", store.Owner{Edge: "edge-a", Epoch: 0}) // no epoch: no seed
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m0", Text: "read"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("send: %s, %v", o, err)
	}
	if n := owners.reads.Load(); n != 1 {
		t.Fatalf("a seed of epoch 0 served the output: %d reads, want 1", n)
	}
	if c := <-cached; c {
		t.Error("the output after a seed of epoch 0 is marked cached")
	}

	// Seeded at the socket's epoch (a cache emptied first): no read.
	cache2 := &dispatch.OwnerCache{Clock: clock.NewFake(time.Unix(1_000_000, 0))}
	d.Cache = cache2
	cache2.Seed("tel-1", store.Owner{Edge: "edge-a", Epoch: e1})
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m1", Text: "seeded"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("send after the seed: %s, %v", o, err)
	}
	if n := owners.reads.Load(); n != 1 {
		t.Fatalf("the seeded output read the owner: %d reads, want 1", n)
	}
	if c := <-cached; !c {
		t.Error("the seeded output is not marked cached: the edge would not fence it")
	}
	if got := wrote.Load(); got != e1 {
		t.Fatalf("written at epoch %d, want %d", got, e1)
	}

	// The device moved on: an event of the old socket seeds a stale owner,
	// which must not replace the fresher entry a read put there.
	e2, err := st.ClaimDevice(ctx, "tel-1", "edge-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	second, _ := edgeAt(t, b, "tel-1", e2)
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := spy.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	d.Cache = &dispatch.OwnerCache{Clock: clock.NewFake(time.Unix(1_000_000, 0))}
	d.Cache.Seed("tel-1", store.Owner{Edge: "edge-a", Epoch: e1}) // stale
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m2", Text: "after the move"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("send with a stale seed: %s, %v", o, err)
	}
	if got := second.Load(); got != e2 {
		t.Fatalf("a stale seed delivered at epoch %d, want the new socket's %d", got, e2)
	}
	if n := owners.reads.Load(); n != 2 {
		t.Fatalf("a stale seed: %d reads, want 2 (read again once after moved)", n)
	}
	d.Cache.Seed("tel-1", store.Owner{Edge: "edge-a", Epoch: e1}) // older than the entry the read left
	if o, err := d.Send(ctx, wire.Output{Op: wire.OpMessage, Device: "tel-1", ID: "m3", Text: "again"}); err != nil || o != dispatch.Delivered {
		t.Fatalf("send: %s, %v", o, err)
	}
	if n := owners.reads.Load(); n != 2 {
		t.Fatalf("an older seed replaced the fresher entry: %d reads, want 2", n)
	}
	if got := second.Load(); got != e2 {
		t.Fatalf("delivered at epoch %d, want %d", got, e2)
	}
}
