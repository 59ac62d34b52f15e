package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var outboxTests = []test{
	{"Order", testOutboxOrder},
	{"TakeUnknown", testOutboxTakeUnknown},
	{"MaxDropsOldest", testOutboxMaxDropsOldest},
	{"TTL", testOutboxTTL},
	{"DevicesIndependent", testOutboxDevicesIndependent},
	{"ItemsCopied", testOutboxItemsCopied},
	{"ConcurrentPush", testOutboxConcurrentPush},
}

func push(t *testing.T, s store.Store, device, item string, max int, ttl time.Duration) {
	t.Helper()
	if err := s.PushOutbox(t.Context(), device, []byte(item), max, ttl); err != nil {
		t.Fatalf("PushOutbox(%q): %v", item, err)
	}
}

func takeOutbox(t *testing.T, s store.Store, device string) []string {
	t.Helper()
	items, err := s.TakeOutbox(t.Context(), device)
	if err != nil {
		t.Fatalf("TakeOutbox: %v", err)
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it)
	}
	return out
}

func wantOutbox(t *testing.T, s store.Store, device string, want ...string) {
	t.Helper()
	if got := takeOutbox(t, s, device); !slices.Equal(got, want) {
		t.Fatalf("TakeOutbox = %q, want %q", got, want)
	}
}

func testOutboxOrder(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for _, it := range []string{"a", "b", "c"} {
		push(t, s, dev, it, 10, time.Minute)
	}
	wantOutbox(t, s, dev, "a", "b", "c")
	wantOutbox(t, s, dev) // Take empties
	push(t, s, dev, "d", 10, time.Minute)
	wantOutbox(t, s, dev, "d")
}

func testOutboxTakeUnknown(t *testing.T, s store.Store) {
	wantOutbox(t, s, name(t, "dev"))
}

func testOutboxMaxDropsOldest(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	for i := 1; i <= 5; i++ {
		push(t, s, dev, fmt.Sprint(i), 3, time.Minute)
	}
	wantOutbox(t, s, dev, "3", "4", "5")
}

// testOutboxTTL forgets each item ttl after its push, whether or not newer
// items follow it.
func testOutboxTTL(t *testing.T, s store.Store) {
	const ttl = 2 * time.Second
	mixed, gone, later := name(t, "mixed"), name(t, "gone"), name(t, "later")
	t0 := time.Now()
	push(t, s, mixed, "old", 10, ttl)
	push(t, s, gone, "old", 10, ttl)
	push(t, s, later, "old", 10, ttl)
	time.Sleep(time.Until(t0.Add(time.Second)))
	push(t, s, mixed, "fresh", 10, ttl)
	time.Sleep(time.Until(t0.Add(ttl + 400*time.Millisecond)))
	wantOutbox(t, s, mixed, "fresh") // old is 2.4 s old, fresh 1.4 s
	wantOutbox(t, s, gone)
	push(t, s, later, "new", 10, ttl)
	wantOutbox(t, s, later, "new")
}

func testOutboxDevicesIndependent(t *testing.T, s store.Store) {
	d1, d2 := name(t, "dev1"), name(t, "dev2")
	push(t, s, d1, "1a", 2, time.Minute)
	push(t, s, d2, "2a", 2, time.Minute)
	push(t, s, d1, "1b", 2, time.Minute)
	push(t, s, d1, "1c", 2, time.Minute)
	wantOutbox(t, s, d1, "1b", "1c")
	wantOutbox(t, s, d2, "2a")
}

func testOutboxItemsCopied(t *testing.T, s store.Store) {
	dev := name(t, "dev")
	item := []byte("frame")
	if err := s.PushOutbox(t.Context(), dev, item, 10, time.Minute); err != nil {
		t.Fatalf("PushOutbox: %v", err)
	}
	copy(item, "XXXXX")
	wantOutbox(t, s, dev, "frame")
}

// testOutboxConcurrentPush races writers: nothing is lost and each writer's
// items keep their order.
func testOutboxConcurrentPush(t *testing.T, s store.Store) {
	const writers, each = 8, 20
	dev := name(t, "dev")
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := s.PushOutbox(t.Context(), dev, fmt.Appendf(nil, "%d/%d", w, i), 1000, time.Minute); err != nil {
					t.Errorf("PushOutbox: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	items := takeOutbox(t, s, dev)
	if len(items) != writers*each {
		t.Fatalf("TakeOutbox returned %d items, want %d", len(items), writers*each)
	}
	next := make([]int, writers)
	for _, it := range items {
		var w, i int
		if _, err := fmt.Sscanf(it, "%d/%d", &w, &i); err != nil || w < 0 || w >= writers {
			t.Fatalf("unexpected item %q", it)
		}
		if i != next[w] {
			t.Fatalf("writer %d: item %d came where %d was due", w, i, next[w])
		}
		next[w]++
	}
}
