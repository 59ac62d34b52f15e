package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Rates runs the conformance tests of store.Rates on stores that newStore
// makes with the clock it is given (a clock.Fake each test moves). Every
// test runs in parallel on a store of its own, closed when it ends.
func Rates(t *testing.T, newStore func(t *testing.T, c clock.Clock) store.Store) {
	tests := []struct {
		name string
		run  func(t *testing.T, s store.Store, c *clock.Fake)
	}{
		{"InOneWindow", testRatesInOneWindow},
		{"NextWindow", testRatesNextWindow},
		{"KeysApart", testRatesKeysApart},
		{"Concurrent", testRatesConcurrent},
		{"Bad", testRatesBad},
	}
	t.Run("Rates", func(t *testing.T) {
		t.Parallel()
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				// A quarter into a second, so a window of one ends in 750 ms.
				c := clock.NewFake(time.Unix(1_900_000_000, 250*int64(time.Millisecond)))
				tc.run(t, open(t, func(t *testing.T) store.Store { return newStore(t, c) }), c)
			})
		}
	})
}

func countRate(t *testing.T, s store.Store, key string, n int64, window time.Duration, want int64, wantLeft time.Duration) {
	t.Helper()
	c, left, err := s.CountRate(t.Context(), key, n, window)
	if err != nil || c != want || left != wantLeft {
		t.Fatalf("CountRate(%s, %d, %v) = %d, %v, %v; want %d, %v", key, n, window, c, left, err, want, wantLeft)
	}
}

func testRatesInOneWindow(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	countRate(t, s, k, 1, time.Second, 1, 750*time.Millisecond)
	countRate(t, s, k, 4, time.Second, 5, 750*time.Millisecond)
	c.Advance(700 * time.Millisecond)
	countRate(t, s, k, 0, time.Second, 5, 50*time.Millisecond) // n 0 reads
	countRate(t, s, k, 1, time.Second, 6, 50*time.Millisecond)
}

func testRatesNextWindow(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	countRate(t, s, k, 3, time.Second, 3, 750*time.Millisecond)
	c.Advance(750 * time.Millisecond) // the window's end is the next one's start
	countRate(t, s, k, 1, time.Second, 1, time.Second)
	c.Advance(5 * time.Second) // windows in between counted nothing
	countRate(t, s, k, 0, time.Second, 0, time.Second)
	// A window of another length counts on its own.
	countRate(t, s, k, 2, 10*time.Second, 2, 4*time.Second)
}

func testRatesKeysApart(t *testing.T, s store.Store, c *clock.Fake) {
	a, b := rateKey(t, "a"), rateKey(t, "b")
	countRate(t, s, a, 7, time.Second, 7, 750*time.Millisecond)
	countRate(t, s, b, 1, time.Second, 1, 750*time.Millisecond)
	countRate(t, s, a, 0, time.Second, 7, 750*time.Millisecond)
}

func testRatesConcurrent(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 10 {
				if _, _, err := s.CountRate(t.Context(), k, 1, time.Second); err != nil {
					t.Errorf("CountRate: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	countRate(t, s, k, 0, time.Second, 200, 750*time.Millisecond)
}

func testRatesBad(t *testing.T, s store.Store, c *clock.Fake) {
	if _, _, err := s.CountRate(t.Context(), rateKey(t, "r"), 1, 0); err == nil {
		t.Fatal("CountRate with a window of 0: no error")
	}
}

// rateKey is a key of the test's own: the name holds no brace.
func rateKey(t *testing.T, name string) string { return leaseKey(t) + "-" + name }

// Clocked runs the conformance tests that move the store's clock: Leases
// and Rates.
func Clocked(t *testing.T, newStore func(t *testing.T, c clock.Clock) store.Store) {
	Leases(t, newStore)
	Rates(t, newStore)
}
