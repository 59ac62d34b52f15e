package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Leases runs the conformance tests of store.Leases on stores that
// newStore makes with the clock it is given (a clock.Fake each test
// moves), so expiry is tested without waiting. Every test runs in parallel
// on a store of its own, closed when it ends.
func Leases(t *testing.T, newStore func(t *testing.T, c clock.Clock) store.Store) {
	runClocked(t, "Leases", time.Now(), newStore, []clockedTest{
		{"AtLimit", testLeasesAtLimit},
		{"SameIDKeepsItsPlace", testLeasesSameID},
		{"Expire", testLeasesExpire},
		{"Renew", testLeasesRenew},
		{"KeysApart", testLeasesKeysApart},
		{"Concurrent", testLeasesConcurrent},
		{"Bad", testLeasesBad},
	})
}

// clockedTest is a subtest on a store whose clock it moves.
type clockedTest struct {
	name string
	run  func(t *testing.T, s store.Store, c *clock.Fake)
}

// runClocked runs tests as subtests of group, in parallel, each on a store
// of its own whose clock is a clock.Fake starting at start.
func runClocked(t *testing.T, group string, start time.Time, newStore func(t *testing.T, c clock.Clock) store.Store, tests []clockedTest) {
	t.Run(group, func(t *testing.T) {
		t.Parallel()
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				c := clock.NewFake(start)
				tc.run(t, open(t, func(t *testing.T) store.Store { return newStore(t, c) }), c)
			})
		}
	})
}

func acquire(t *testing.T, s store.Store, key, id string, limit int, ttl time.Duration, wantOK bool, wantHeld int) {
	t.Helper()
	ok, held, err := s.AcquireLease(t.Context(), key, id, limit, ttl)
	if err != nil || ok != wantOK || held != wantHeld {
		t.Fatalf("AcquireLease(%s, limit %d) = %v, %d, %v; want %v, %d", id, limit, ok, held, err, wantOK, wantHeld)
	}
}

func wantLeases(t *testing.T, s store.Store, key string, want int) {
	t.Helper()
	if n, err := s.LeaseCount(t.Context(), key); err != nil || n != want {
		t.Fatalf("LeaseCount = %d, %v; want %d", n, err, want)
	}
}

func releaseLease(t *testing.T, s store.Store, key, id string) {
	t.Helper()
	if err := s.ReleaseLease(t.Context(), key, id); err != nil {
		t.Fatalf("ReleaseLease(%s): %v", id, err)
	}
}

// testLeasesAtLimit: exactly limit ids hold leases; the next is refused
// with the count; a release lets the next in; releasing what is not held
// is not an error.
func testLeasesAtLimit(t *testing.T, s store.Store, _ *clock.Fake) {
	key := leaseKey(t)
	wantLeases(t, s, key, 0)
	for i := 1; i <= 3; i++ {
		acquire(t, s, key, fmt.Sprint("id-", i), 3, time.Minute, true, i)
	}
	acquire(t, s, key, "id-4", 3, time.Minute, false, 3)
	wantLeases(t, s, key, 3)
	releaseLease(t, s, key, "id-2")
	wantLeases(t, s, key, 2)
	acquire(t, s, key, "id-4", 3, time.Minute, true, 3)
	acquire(t, s, key, "id-2", 3, time.Minute, false, 3)
	releaseLease(t, s, key, "id-2") // not held
	releaseLease(t, s, key, "none")
	wantLeases(t, s, key, 3)
	for _, id := range []string{"id-1", "id-3", "id-4"} {
		releaseLease(t, s, key, id)
	}
	wantLeases(t, s, key, 0)
}

// testLeasesSameID: an id that holds a lease acquires again when the count
// is at (or past) the limit, without counting twice.
func testLeasesSameID(t *testing.T, s store.Store, c *clock.Fake) {
	key := leaseKey(t)
	acquire(t, s, key, "a", 2, time.Minute, true, 1)
	acquire(t, s, key, "b", 2, time.Minute, true, 2)
	acquire(t, s, key, "a", 2, time.Minute, true, 2)
	acquire(t, s, key, "a", 1, time.Minute, true, 2) // past a lower limit: still its own
	// Acquiring again renews: a outlives b.
	c.Advance(30 * time.Second)
	acquire(t, s, key, "a", 2, time.Minute, true, 2)
	c.Advance(30 * time.Second)
	wantLeases(t, s, key, 1)
	acquire(t, s, key, "c", 2, time.Minute, true, 2)
}

// testLeasesExpire: a lease is gone at its deadline exactly, by the
// store's clock, and its place is free.
func testLeasesExpire(t *testing.T, s store.Store, c *clock.Fake) {
	key := leaseKey(t)
	acquire(t, s, key, "a", 2, 10*time.Second, true, 1)
	c.Advance(5 * time.Second)
	acquire(t, s, key, "b", 2, 10*time.Second, true, 2)
	acquire(t, s, key, "c", 2, 10*time.Second, false, 2)
	c.Advance(5*time.Second - time.Millisecond)
	wantLeases(t, s, key, 2)
	acquire(t, s, key, "c", 2, 10*time.Second, false, 2)
	c.Advance(time.Millisecond) // a's deadline
	wantLeases(t, s, key, 1)
	acquire(t, s, key, "c", 2, 10*time.Second, true, 2)
	c.Advance(time.Minute)
	wantLeases(t, s, key, 0)
}

// testLeasesRenew: RenewLeases extends the ids given, in one call, and
// leaves the others to expire; it takes again a lease that lapsed or was
// released (its holder is still there), past the limit if need be.
func testLeasesRenew(t *testing.T, s store.Store, c *clock.Fake) {
	key := leaseKey(t)
	ttl := 10 * time.Second
	for _, id := range []string{"a", "b", "c"} {
		acquire(t, s, key, id, 3, ttl, true, map[string]int{"a": 1, "b": 2, "c": 3}[id])
	}
	c.Advance(8 * time.Second)
	if err := s.RenewLeases(t.Context(), key, []string{"a", "c"}, ttl); err != nil {
		t.Fatalf("RenewLeases: %v", err)
	}
	c.Advance(3 * time.Second)
	wantLeases(t, s, key, 2) // b lapsed
	acquire(t, s, key, "d", 3, ttl, true, 3)
	releaseLease(t, s, key, "a")
	acquire(t, s, key, "e", 3, ttl, true, 3)
	if err := s.RenewLeases(t.Context(), key, []string{"a", "b"}, ttl); err != nil {
		t.Fatalf("RenewLeases: %v", err)
	}
	wantLeases(t, s, key, 5)
	acquire(t, s, key, "f", 3, ttl, false, 5)
	if err := s.RenewLeases(t.Context(), key, nil, ttl); err != nil {
		t.Fatalf("RenewLeases(none): %v", err)
	}
	c.Advance(ttl)
	wantLeases(t, s, key, 0)
}

// testLeasesKeysApart: a full key leaves another key's room alone.
func testLeasesKeysApart(t *testing.T, s store.Store, _ *clock.Fake) {
	a, b := leaseKey(t)+"-a", leaseKey(t)+"-b"
	acquire(t, s, a, "x", 1, time.Minute, true, 1)
	acquire(t, s, a, "y", 1, time.Minute, false, 1)
	acquire(t, s, b, "y", 1, time.Minute, true, 1)
	acquire(t, s, b, "x", 1, time.Minute, false, 1)
	releaseLease(t, s, a, "y") // b's holder, not a's
	wantLeases(t, s, a, 1)
	wantLeases(t, s, b, 1)
}

// testLeasesConcurrent: of many ids acquiring at once, exactly limit get
// a lease.
func testLeasesConcurrent(t *testing.T, s store.Store, _ *clock.Fake) {
	key := leaseKey(t)
	const limit, tries = 5, 24
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for i := range tries {
		wg.Go(func() {
			ok, _, err := s.AcquireLease(t.Context(), key, fmt.Sprint("id-", i), limit, time.Minute)
			if err != nil {
				t.Errorf("AcquireLease: %v", err)
			}
			if ok {
				mu.Lock()
				got++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got != limit {
		t.Fatalf("%d of %d concurrent acquires got a lease, want %d", got, tries, limit)
	}
	wantLeases(t, s, key, limit)
}

// testLeasesBad: a limit below 1 admits nobody; a ttl that is not
// positive is an error.
func testLeasesBad(t *testing.T, s store.Store, _ *clock.Fake) {
	key := leaseKey(t)
	acquire(t, s, key, "a", 0, time.Minute, false, 0)
	wantLeases(t, s, key, 0)
	if _, _, err := s.AcquireLease(t.Context(), key, "a", 1, 0); err == nil {
		t.Fatal("AcquireLease with ttl 0: no error")
	}
	if err := s.RenewLeases(t.Context(), key, []string{"a"}, -time.Second); err == nil {
		t.Fatal("RenewLeases with a negative ttl: no error")
	}
	wantLeases(t, s, key, 0)
}

// leaseKey is a key for t's semaphore: no braces (store.Leases).
func leaseKey(t *testing.T) string {
	return "storetest-" + runID + "-" + fmt.Sprintf("%x", []byte(t.Name()))
}
