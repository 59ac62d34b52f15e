package edge

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// countedRenewals is a memstore that counts RenewLeases calls, and whose
// RenewEdge waits for its context: the heartbeat's first pass stays there
// until the test's server closes (or a beat, minutes, passes), so the
// test's own renewals are the only ones.
type countedRenewals struct {
	*memstore.Store
	calls atomic.Int64
}

func (s *countedRenewals) RenewEdge(ctx context.Context, edge string, ttl time.Duration) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func (s *countedRenewals) RenewLeases(ctx context.Context, key string, ids []string, ttl time.Duration) error {
	s.calls.Add(1)
	return s.Store.RenewLeases(ctx, key, ids, ttl)
}

// TestConnLeasesRenewed: the heartbeat's renewal keeps the places of the
// file owners' sockets here past their ttl (OwnerTTL), in one store call
// per owner whatever its sockets; a place given back meanwhile by a
// replaced socket elsewhere is taken again; a legacy socket holds none.
func TestConnLeasesRenewed(t *testing.T) {
	clk := clock.NewFake(time.Now())
	st := &countedRenewals{Store: memstore.New(memstore.Options{Clock: clk})}
	s := New(Config{ID: "edge-a", OwnerTTL: 3 * time.Minute}, st, nil, nil)
	t.Cleanup(func() { s.Close() })
	ttl := s.cfg.OwnerTTL
	ctx := t.Context()
	acme, beta := tenant.QuotaKey("acme", tenant.QuotaConnections), tenant.QuotaKey("beta", tenant.QuotaConnections)
	devices := []string{tenant.DeviceKey("acme", "tel-1"), tenant.DeviceKey("acme", "tel-2"), tenant.DeviceKey("beta", "tel-1"), "legacy-tel"}
	for i, dev := range devices {
		c := &conn{srv: s, session: session{device: dev}}
		c.epoch.Store(int64(i + 1))
		if owner := tenant.OwnerOf(dev); owner != tenant.Legacy {
			if ok, _, err := st.AcquireLease(ctx, tenant.QuotaKey(owner, tenant.QuotaConnections), dev, 10, ttl); !ok || err != nil {
				t.Fatalf("AcquireLease(%s) = %v, %v", dev, ok, err)
			}
			c.leased.Store(true)
		}
		if ok, _, err := s.register(c); !ok || err != nil {
			t.Fatalf("register(%s) = %v, %v", dev, ok, err)
		}
	}
	count := func(key string) int {
		t.Helper()
		n, err := st.LeaseCount(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// tel-2's place was given back by a socket it replaced elsewhere.
	if err := st.ReleaseLease(ctx, acme, devices[1]); err != nil {
		t.Fatal(err)
	}
	clk.Advance(ttl * 2 / 3)
	before := st.calls.Load()
	s.renewConnLeases(time.Second)
	if calls := st.calls.Load() - before; calls != 2 {
		t.Fatalf("renewing 3 sockets of 2 owners took %d store calls, want 2", calls)
	}
	clk.Advance(ttl * 2 / 3) // past the first ttl, within the renewed one
	if a, b := count(acme), count(beta); a != 2 || b != 1 {
		t.Fatalf("after the renewal, past the first ttl: acme %d, beta %d places; want 2 and 1", a, b)
	}
	clk.Advance(ttl) // nobody renewed since
	if a, b := count(acme), count(beta); a != 0 || b != 0 {
		t.Fatalf("a ttl after the last renewal: acme %d, beta %d places; want none", a, b)
	}
}
