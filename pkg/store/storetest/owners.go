package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var ownerTests = []test{
	{"ClaimAndOwner", testClaimAndOwner},
	{"ClaimConcurrent", testClaimDeviceConcurrent},
	{"OwnersInOneCall", testDeviceOwners},
	{"ReleaseWithCurrentEpoch", testReleaseWithCurrentEpoch},
	{"ReleaseUnknown", testReleaseUnknown},
	{"RefreshKeepsHeld", testRefreshKeepsHeld},
	{"RefreshReportsLost", testRefreshReportsLost},
	{"OwnershipExpires", testOwnershipExpires},
	{"AcksRemembered", testAcksRemembered},
	{"AcksExpire", testAcksExpire},
	{"ClaimReportsPrev", testClaimReportsPrev},
	{"ClaimReportsOutbox", testClaimReportsOutbox},
	{"LeaseHoldsRecords", testLeaseHoldsRecords},
	{"LeaselessRecordsStand", testLeaselessRecordsStand},
}

// claimAcks claims device for edge and fails t unless the claim reports
// acks as want; it returns the epoch.
func claimAcks(t *testing.T, s store.Store, device, edge string, want bool) int64 {
	t.Helper()
	c, err := s.ClaimDeviceAcks(t.Context(), device, edge, time.Minute)
	if err != nil {
		t.Fatalf("ClaimDeviceAcks(%s, %s): %v", device, edge, err)
	}
	if c.Acks != want {
		t.Fatalf("ClaimDeviceAcks(%s, %s) reports acks %v, want %v", device, edge, c.Acks, want)
	}
	return c.Epoch
}

func setAcks(t *testing.T, s store.Store, device string, ttl time.Duration) {
	t.Helper()
	if err := s.SetDeviceAcks(t.Context(), device, ttl); err != nil {
		t.Fatalf("SetDeviceAcks(%s): %v", device, err)
	}
}

// testAcksRemembered: a claim reports whether the device acks. The record
// is per device, outlives the owner record and is left by claims; a
// ClaimDeviceAcks hands out epochs and records owners as ClaimDevice does.
func testAcksRemembered(t *testing.T, s store.Store) {
	dev, other := name(t, "dev"), name(t, "other")
	e1 := claimAcks(t, s, dev, "edge-1", false)
	wantOwner(t, s, dev, store.Owner{Edge: "edge-1", Epoch: e1})
	setAcks(t, s, dev, time.Minute)
	releaseDevice(t, s, dev, e1)
	e2 := claimAcks(t, s, dev, "edge-2", true)
	if e2 <= e1 {
		t.Fatalf("ClaimDeviceAcks epoch %d not greater than %d", e2, e1)
	}
	wantOwner(t, s, dev, store.Owner{Edge: "edge-2", Epoch: e2})
	if e3 := claimDevice(t, s, dev, "edge-1", time.Minute); e3 <= e2 {
		t.Fatalf("ClaimDevice epoch %d not greater than ClaimDeviceAcks' %d", e3, e2)
	}
	claimAcks(t, s, dev, "edge-1", true)
	claimAcks(t, s, other, "edge-1", false)
	setAcks(t, s, other, time.Minute) // again: still one record
	setAcks(t, s, other, time.Minute)
	claimAcks(t, s, other, "edge-1", true)
}

// testAcksExpire: the record lives its ttl from the last SetDeviceAcks.
func testAcksExpire(t *testing.T, s store.Store) {
	dev, renewed := name(t, "dev"), name(t, "renewed")
	setAcks(t, s, dev, time.Second)
	setAcks(t, s, renewed, time.Second)
	setAcks(t, s, renewed, time.Minute)
	claimAcks(t, s, dev, "edge-1", true)
	eventually(t, expiryWait, "device recorded as acking for 1s acks", func() bool {
		c, err := s.ClaimDeviceAcks(t.Context(), dev, "edge-1", time.Minute)
		if err != nil {
			t.Fatalf("ClaimDeviceAcks: %v", err)
		}
		return !c.Acks
	})
	claimAcks(t, s, renewed, "edge-1", true)
}

func claimDevice(t *testing.T, s store.Store, device, edge string, ttl time.Duration) int64 {
	t.Helper()
	epoch, err := s.ClaimDevice(t.Context(), device, edge, ttl)
	if err != nil {
		t.Fatalf("ClaimDevice(%s, %s): %v", device, edge, err)
	}
	return epoch
}

func wantOwner(t *testing.T, s store.Store, device string, want store.Owner) {
	t.Helper()
	got, err := s.DeviceOwner(t.Context(), device)
	if err != nil {
		t.Fatalf("DeviceOwner(%s): %v", device, err)
	}
	if got != want {
		t.Fatalf("DeviceOwner(%s) = %+v, want %+v", device, got, want)
	}
}

func wantNoOwner(t *testing.T, s store.Store, device string) {
	t.Helper()
	if got, err := s.DeviceOwner(t.Context(), device); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeviceOwner(%s) = %+v, %v; want ErrNotFound", device, got, err)
	}
}

func hasOwner(t *testing.T, s store.Store, device string) bool {
	t.Helper()
	_, err := s.DeviceOwner(t.Context(), device)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeviceOwner(%s): %v", device, err)
	}
	return err == nil
}

// wantLost refreshes owned and fails t unless exactly want were lost.
func wantLost(t *testing.T, s store.Store, owned map[string]int64, ttl time.Duration, want ...string) {
	t.Helper()
	lost, err := s.RefreshDevices(t.Context(), owned, ttl)
	if err != nil {
		t.Fatalf("RefreshDevices: %v", err)
	}
	lost = slices.Clone(lost)
	slices.Sort(lost)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(lost, want) {
		t.Fatalf("RefreshDevices lost %q, want %q", lost, want)
	}
}

func releaseDevice(t *testing.T, s store.Store, device string, epoch int64) {
	t.Helper()
	if err := s.ReleaseDevice(t.Context(), device, epoch); err != nil {
		t.Fatalf("ReleaseDevice(%s, %d): %v", device, epoch, err)
	}
}

func testClaimAndOwner(t *testing.T, s store.Store) {
	dev, other := name(t, "dev"), name(t, "other")
	wantNoOwner(t, s, dev)
	e1 := claimDevice(t, s, dev, "edge-1", time.Minute)
	wantOwner(t, s, dev, store.Owner{Edge: "edge-1", Epoch: e1})
	wantNoOwner(t, s, other)
	o1 := claimDevice(t, s, other, "edge-1", time.Minute)
	e2 := claimDevice(t, s, dev, "edge-2", time.Minute)
	if e2 <= e1 {
		t.Fatalf("second claim epoch %d not greater than first %d", e2, e1)
	}
	wantOwner(t, s, dev, store.Owner{Edge: "edge-2", Epoch: e2})
	e3 := claimDevice(t, s, dev, "edge-1", time.Minute)
	if e3 <= e2 {
		t.Fatalf("third claim epoch %d not greater than second %d", e3, e2)
	}
	wantOwner(t, s, dev, store.Owner{Edge: "edge-1", Epoch: e3})
	wantOwner(t, s, other, store.Owner{Edge: "edge-1", Epoch: o1})
}

// testDeviceOwners reads several owners at once: in the order asked, the
// zero Owner for a device never claimed or released, the same device twice
// alike, and nothing for no devices.
func testDeviceOwners(t *testing.T, s store.Store) {
	a, b, gone, never := name(t, "a"), name(t, "b"), name(t, "gone"), name(t, "never")
	ea := claimDevice(t, s, a, "edge-1", time.Minute)
	eb := claimDevice(t, s, b, "edge-2", time.Minute)
	releaseDevice(t, s, gone, claimDevice(t, s, gone, "edge-1", time.Minute))
	got, err := s.DeviceOwners(t.Context(), []string{b, never, a, gone, b})
	if err != nil {
		t.Fatalf("DeviceOwners: %v", err)
	}
	want := []store.Owner{{Edge: "edge-2", Epoch: eb}, {}, {Edge: "edge-1", Epoch: ea}, {}, {Edge: "edge-2", Epoch: eb}}
	if !slices.Equal(got, want) {
		t.Fatalf("DeviceOwners = %+v, want %+v", got, want)
	}
	for dev, want := range map[string]store.Owner{a: {Edge: "edge-1", Epoch: ea}, never: {}} {
		if got, err := s.DeviceOwners(t.Context(), []string{dev}); err != nil || !slices.Equal(got, []store.Owner{want}) {
			t.Fatalf("DeviceOwners(%s) = %+v, %v; want [%+v]", dev, got, err, want)
		}
	}
	if got, err := s.DeviceOwners(t.Context(), nil); err != nil || len(got) != 0 {
		t.Fatalf("DeviceOwners(nil) = %+v, %v; want none", got, err)
	}
}

// testClaimDeviceConcurrent races claims of one device: every epoch is new,
// each claimer's epochs increase, and the owner is the claim with the
// greatest epoch.
func testClaimDeviceConcurrent(t *testing.T, s store.Store) {
	const workers, claims = 12, 5
	dev := name(t, "dev")
	epochs := make([][]int64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range claims {
				e, err := s.ClaimDevice(t.Context(), dev, fmt.Sprint("edge-", w), time.Minute)
				if err != nil {
					t.Errorf("ClaimDevice: %v", err)
					return
				}
				epochs[w] = append(epochs[w], e)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seenEpoch := map[int64]int{}
	last := store.Owner{Epoch: -1 << 63}
	for w, es := range epochs {
		for i, e := range es {
			if i > 0 && e <= es[i-1] {
				t.Fatalf("edge-%d got epoch %d after %d", w, e, es[i-1])
			}
			if prev, dup := seenEpoch[e]; dup {
				t.Fatalf("epoch %d handed to edge-%d and edge-%d", e, prev, w)
			}
			seenEpoch[e] = w
			if e > last.Epoch {
				last = store.Owner{Edge: fmt.Sprint("edge-", w), Epoch: e}
			}
		}
	}
	wantOwner(t, s, dev, last)
}

func testReleaseWithCurrentEpoch(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	e1 := claimDevice(t, s, dev, "edge-1", time.Minute)
	e2 := claimDevice(t, s, dev, "edge-2", time.Minute)
	releaseDevice(t, s, dev, e1) // the old owner closing late
	wantOwner(t, s, dev, store.Owner{Edge: "edge-2", Epoch: e2})
	releaseDevice(t, s, dev, e2)
	wantNoOwner(t, s, dev)
	if e3 := claimDevice(t, s, dev, "edge-1", time.Minute); e3 <= e2 {
		t.Fatalf("claim after release got epoch %d, not greater than %d", e3, e2)
	}
}

func testReleaseUnknown(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	releaseDevice(t, s, dev, 1)
	wantNoOwner(t, s, dev)
}

func testRefreshKeepsHeld(t *testing.T, s store.Store) {
	held, control := name(t, "held"), name(t, "control")
	e := claimDevice(t, s, held, "edge-1", time.Second)
	claimDevice(t, s, control, "edge-1", time.Second)
	wantLost(t, s, map[string]int64{held: e}, time.Minute)
	wantOwner(t, s, held, store.Owner{Edge: "edge-1", Epoch: e})
	// Once the first ttl has certainly passed, only the refreshed one is held.
	eventually(t, expiryWait, "device claimed for 1s is owned", func() bool { return !hasOwner(t, s, control) })
	wantOwner(t, s, held, store.Owner{Edge: "edge-1", Epoch: e})
	wantLost(t, s, map[string]int64{held: e}, time.Minute)
}

func testRefreshReportsLost(t *testing.T, s store.Store) {
	taken, released, never, kept := name(t, "taken"), name(t, "released"), name(t, "never"), name(t, "kept")
	eOld := claimDevice(t, s, taken, "edge-1", time.Minute)
	eNew := claimDevice(t, s, taken, "edge-2", time.Minute)
	eRel := claimDevice(t, s, released, "edge-1", time.Minute)
	releaseDevice(t, s, released, eRel)
	eKept := claimDevice(t, s, kept, "edge-1", time.Minute)
	owned := map[string]int64{taken: eOld, released: eRel, never: 1, kept: eKept}
	wantLost(t, s, owned, time.Minute, taken, released, never)
	// A refresh at a stale epoch changes nothing.
	wantOwner(t, s, taken, store.Owner{Edge: "edge-2", Epoch: eNew})
	wantNoOwner(t, s, released)
	wantNoOwner(t, s, never)
	wantOwner(t, s, kept, store.Owner{Edge: "edge-1", Epoch: eKept})
	wantLost(t, s, map[string]int64{taken: eNew}, time.Minute)
	wantLost(t, s, map[string]int64{}, time.Minute)
}

func testOwnershipExpires(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	e := claimDevice(t, s, dev, "edge-1", time.Second)
	wantOwner(t, s, dev, store.Owner{Edge: "edge-1", Epoch: e})
	eventually(t, expiryWait, "device claimed for 1s is owned", func() bool { return !hasOwner(t, s, dev) })
	wantLost(t, s, map[string]int64{dev: e}, time.Minute, dev)
	wantNoOwner(t, s, dev) // a refresh does not bring it back
	if e2 := claimDevice(t, s, dev, "edge-2", time.Minute); e2 <= e {
		t.Fatalf("claim after expiry got epoch %d, not greater than %d", e2, e)
	}
}

// testClaimReportsPrev: a claim reports the owner record it replaced, the
// zero Owner when there was none (never claimed, released, expired).
func testClaimReportsPrev(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	claim := func(edge string, want store.Owner) int64 {
		t.Helper()
		c, err := s.ClaimDeviceAcks(t.Context(), dev, edge, time.Minute)
		if err != nil {
			t.Fatalf("ClaimDeviceAcks(%s, %s): %v", dev, edge, err)
		}
		if c.Prev != want {
			t.Fatalf("ClaimDeviceAcks(%s, %s) replaced %+v, want %+v", dev, edge, c.Prev, want)
		}
		return c.Epoch
	}
	e1 := claim("edge-1", store.Owner{})
	e2 := claim("edge-2", store.Owner{Edge: "edge-1", Epoch: e1})
	e3 := claim("edge-2", store.Owner{Edge: "edge-2", Epoch: e2})
	releaseDevice(t, s, dev, e3)
	claim("edge-1", store.Owner{})
}

// testClaimReportsOutbox: a claim reports whether the device's outbox
// holds items: not before the first push, after it, and not once every
// item was acknowledged.
func testClaimReportsOutbox(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	claim := func(want bool) int64 {
		t.Helper()
		c, err := s.ClaimDeviceAcks(t.Context(), dev, "edge-1", time.Minute)
		if err != nil {
			t.Fatalf("ClaimDeviceAcks(%s): %v", dev, err)
		}
		if c.Outbox != want {
			t.Fatalf("ClaimDeviceAcks(%s) reports outbox %v, want %v", dev, c.Outbox, want)
		}
		return c.Epoch
	}
	claim(false)
	if _, err := s.PushOutbox(t.Context(), dev, []byte("kept"), store.OutboxLimits{MaxItems: 10, TTL: time.Minute}); err != nil {
		t.Fatalf("PushOutbox: %v", err)
	}
	epoch := claim(true)
	items, err := s.PeekOutbox(t.Context(), dev, 0)
	if err != nil || len(items) != 1 {
		t.Fatalf("PeekOutbox = %v, %v; want the one item", items, err)
	}
	if ok, err := s.AckOutbox(t.Context(), dev, epoch, items[0].Seq); err != nil || !ok {
		t.Fatalf("AckOutbox = %v, %v", ok, err)
	}
	claim(false)
}

func renewEdge(t *testing.T, s store.Store, edge string, ttl time.Duration, wantFresh bool) {
	t.Helper()
	fresh, err := s.RenewEdge(t.Context(), edge, ttl)
	if err != nil {
		t.Fatalf("RenewEdge(%s): %v", edge, err)
	}
	if fresh != wantFresh {
		t.Fatalf("RenewEdge(%s) reports fresh %v, want %v", edge, fresh, wantFresh)
	}
}

// testLeaseHoldsRecords: records claimed for an hour stand while their
// edge's lease lives and read as none (one by one and in one call) once it
// lapses, within about a second; another edge's records are not touched;
// a renewal after the lapse reports it fresh and the records stand again,
// at their epochs.
func testLeaseHoldsRecords(t *testing.T, s store.Store) {
	edge, other := name(t, "edge"), name(t, "other")
	dev, dev2 := name(t, "dev"), name(t, "dev2")
	renewEdge(t, s, edge, time.Second, true)
	renewEdge(t, s, edge, time.Second, false)
	renewEdge(t, s, other, time.Minute, true)
	e := claimDevice(t, s, dev, edge, time.Hour)
	e2 := claimDevice(t, s, dev2, other, time.Hour)
	wantOwner(t, s, dev, store.Owner{Edge: edge, Epoch: e})
	eventually(t, expiryWait, "the records of an edge whose 1 s lease lapsed read as none", func() bool { return !hasOwner(t, s, dev) })
	got, err := s.DeviceOwners(t.Context(), []string{dev, dev2})
	if err != nil {
		t.Fatal(err)
	}
	if want := []store.Owner{{}, {Edge: other, Epoch: e2}}; !slices.Equal(got, want) {
		t.Fatalf("DeviceOwners with one edge's lease lapsed = %v, want %v", got, want)
	}
	wantOwner(t, s, dev2, store.Owner{Edge: other, Epoch: e2})
	renewEdge(t, s, edge, time.Minute, true)
	eventually(t, expiryWait, "the records of an edge whose lease was renewed stand again", func() bool { return hasOwner(t, s, dev) })
	wantOwner(t, s, dev, store.Owner{Edge: edge, Epoch: e})
	// A refresh and a claim by the lapsed edge's devices work as before.
	wantLost(t, s, map[string]int64{dev: e}, time.Hour)
}

// testLeaselessRecordsStand: an edge that never held a lease (of the
// release before leases) has its records stand on their own ttl.
func testLeaselessRecordsStand(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	e := claimDevice(t, s, dev, name(t, "old-edge"), time.Second)
	wantOwner(t, s, dev, store.Owner{Edge: name(t, "old-edge"), Epoch: e})
	eventually(t, expiryWait, "a record of a leaseless edge claimed for 1s expires", func() bool { return !hasOwner(t, s, dev) })
}
