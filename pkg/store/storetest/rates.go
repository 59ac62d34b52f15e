package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Rates runs the conformance tests of store.Rates on stores that newStore
// makes with the clock it is given (a clock.Fake each test moves, a
// quarter into a second, so a window of one ends in 750 ms). Every test
// runs in parallel on a store of its own, closed when it ends.
func Rates(t *testing.T, newStore func(t *testing.T, c clock.Clock) store.Store) {
	runClocked(t, "Rates", time.Unix(1_900_000_000, 250*int64(time.Millisecond)), newStore, []clockedTest{
		{"InOneWindow", testRatesInOneWindow},
		{"NextWindow", testRatesNextWindow},
		{"KeysApart", testRatesKeysApart},
		{"Concurrent", testRatesConcurrent},
		{"Bad", testRatesBad},
	})
}

// take calls TakeRate with a limit of 10 and checks what it answers.
func take(t *testing.T, s store.Store, key string, n int64, window time.Duration, wantOK bool, want int64, wantLeft time.Duration) {
	t.Helper()
	ok, c, left, err := s.TakeRate(t.Context(), key, n, 10, window)
	if err != nil || ok != wantOK || c != want || left != wantLeft {
		t.Fatalf("TakeRate(%s, %d of 10, %v) = %v, %d, %v, %v; want %v, %d, %v", key, n, window, ok, c, left, err, wantOK, want, wantLeft)
	}
}

func testRatesInOneWindow(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	take(t, s, k, 1, time.Second, true, 1, 750*time.Millisecond)
	take(t, s, k, 4, time.Second, true, 5, 750*time.Millisecond)
	c.Advance(700 * time.Millisecond)
	take(t, s, k, 0, time.Second, true, 5, 50*time.Millisecond) // n 0 reads
	// Exactly the limit is taken; one past it is refused and costs
	// nothing, so what still fits is taken after it.
	take(t, s, k, 5, time.Second, true, 10, 50*time.Millisecond)
	take(t, s, k, 1, time.Second, false, 10, 50*time.Millisecond)
	take(t, s, k, 0, time.Second, true, 10, 50*time.Millisecond)
	k2 := rateKey(t, "r2")
	take(t, s, k2, 11, time.Second, false, 0, 50*time.Millisecond)
	take(t, s, k2, 9, time.Second, true, 9, 50*time.Millisecond)
}

func testRatesNextWindow(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	take(t, s, k, 10, time.Second, true, 10, 750*time.Millisecond)
	take(t, s, k, 1, time.Second, false, 10, 750*time.Millisecond)
	c.Advance(750 * time.Millisecond) // the window's end is the next one's start
	take(t, s, k, 1, time.Second, true, 1, time.Second)
	c.Advance(5 * time.Second) // windows in between counted nothing
	take(t, s, k, 0, time.Second, true, 0, time.Second)
	// A window of another length counts on its own.
	take(t, s, k, 2, 10*time.Second, true, 2, 4*time.Second)
}

func testRatesKeysApart(t *testing.T, s store.Store, c *clock.Fake) {
	a, b := rateKey(t, "a"), rateKey(t, "b")
	take(t, s, a, 10, time.Second, true, 10, 750*time.Millisecond)
	take(t, s, b, 1, time.Second, true, 1, 750*time.Millisecond)
	take(t, s, a, 1, time.Second, false, 10, 750*time.Millisecond)
}

// Twenty takers of one each, ten times, against a limit of 100: exactly
// 100 are taken across them.
func testRatesConcurrent(t *testing.T, s store.Store, c *clock.Fake) {
	k := rateKey(t, "r")
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for range 20 {
		wg.Go(func() {
			for range 10 {
				ok, _, _, err := s.TakeRate(t.Context(), k, 1, 100, time.Second)
				if err != nil {
					t.Errorf("TakeRate: %v", err)
					return
				}
				if ok {
					mu.Lock()
					taken++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if taken != 100 {
		t.Fatalf("%d taken of 200 against a limit of 100", taken)
	}
}

func testRatesBad(t *testing.T, s store.Store, c *clock.Fake) {
	if _, _, _, err := s.TakeRate(t.Context(), rateKey(t, "r"), 1, 10, 0); err == nil {
		t.Fatal("TakeRate with a window of 0: no error")
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
