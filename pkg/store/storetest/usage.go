package storetest

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

var usageTests = []test{
	{"Sums", testUsageSums},
	{"OwnersApart", testUsageOwnersApart},
	{"ZeroNotWritten", testUsageZeroNotWritten},
	{"BadName", testUsageBadName},
	{"Expires", testUsageExpires},
	{"Concurrent", testUsageConcurrent},
}

func addUsage(t *testing.T, s store.Store, add map[string]store.UsageCounts, now time.Time, ttl time.Duration) {
	t.Helper()
	if err := s.AddUsage(t.Context(), add, now, ttl); err != nil {
		t.Fatalf("AddUsage: %v", err)
	}
}

func wantUsage(t *testing.T, s store.Store, owner string, want store.UsageCounts, since time.Time) {
	t.Helper()
	got, at, err := s.Usage(t.Context(), owner)
	if err != nil {
		t.Fatalf("Usage(%q): %v", owner, err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("Usage(%q) = %v, want %v", owner, got, want)
	}
	if !at.Equal(since) {
		t.Fatalf("Usage(%q) since %v, want %v", owner, at, since)
	}
}

// testUsageSums: adds sum per counter, and since is the first add's.
func testUsageSums(t *testing.T, s store.Store) {
	owner := name(t, "acme")
	first := time.UnixMilli(1_700_000_000_123)
	addUsage(t, s, map[string]store.UsageCounts{owner: {"messages_in": 3, "messages_out": 1}}, first, time.Minute)
	wantUsage(t, s, owner, store.UsageCounts{"messages_in": 3, "messages_out": 1}, first)
	addUsage(t, s, map[string]store.UsageCounts{owner: {"messages_in": 2, "deliveries_offline": 7}}, first.Add(time.Second), time.Minute)
	wantUsage(t, s, owner, store.UsageCounts{"messages_in": 5, "messages_out": 1, "deliveries_offline": 7}, first)
}

// testUsageOwnersApart: one call adds to several owners, each its own;
// an owner never counted has nothing, and the empty owner (the legacy
// one) is an owner like the others.
func testUsageOwnersApart(t *testing.T, s store.Store) {
	a, b, never := name(t, "a"), name(t, "b"), name(t, "never")
	now := time.UnixMilli(1_700_000_000_000)
	addUsage(t, s, map[string]store.UsageCounts{a: {"messages_in": 1}, b: {"messages_in": 10, "connections_opened": 2}}, now, time.Minute)
	wantUsage(t, s, a, store.UsageCounts{"messages_in": 1}, now)
	wantUsage(t, s, b, store.UsageCounts{"messages_in": 10, "connections_opened": 2}, now)
	wantUsage(t, s, never, store.UsageCounts{}, time.Time{})
}

// testUsageZeroNotWritten: an owner with only zero counts is not written
// (no since either).
func testUsageZeroNotWritten(t *testing.T, s store.Store) {
	owner := name(t, "idle")
	addUsage(t, s, map[string]store.UsageCounts{owner: {"messages_in": 0}}, time.Now(), time.Minute)
	wantUsage(t, s, owner, store.UsageCounts{}, time.Time{})
}

// testUsageBadName: a counter named since, or empty, fails the call, and
// nothing of it is added.
func testUsageBadName(t *testing.T, s store.Store) {
	owner, other := name(t, "acme"), name(t, "other")
	for _, bad := range []string{store.UsageSince, ""} {
		err := s.AddUsage(t.Context(), map[string]store.UsageCounts{other: {"messages_in": 1}, owner: {bad: 1, "messages_in": 1}}, time.Now(), time.Minute)
		if err == nil {
			t.Fatalf("AddUsage with a counter named %q succeeded", bad)
		}
	}
	wantUsage(t, s, owner, store.UsageCounts{}, time.Time{})
	wantUsage(t, s, other, store.UsageCounts{}, time.Time{})
}

// testUsageExpires: an owner's counts are forgotten ttl after its last
// add, and count from zero (with a new since) after that.
func testUsageExpires(t *testing.T, s store.Store) {
	owner := name(t, "acme")
	now := time.UnixMilli(1_700_000_000_000)
	addUsage(t, s, map[string]store.UsageCounts{owner: {"messages_in": 4}}, now, time.Second)
	wantUsage(t, s, owner, store.UsageCounts{"messages_in": 4}, now)
	eventually(t, expiryWait, "usage expired", func() bool {
		got, _, err := s.Usage(t.Context(), owner)
		if err != nil {
			t.Fatalf("Usage: %v", err)
		}
		return len(got) == 0
	})
	later := now.Add(time.Hour)
	addUsage(t, s, map[string]store.UsageCounts{owner: {"messages_in": 1}}, later, time.Minute)
	wantUsage(t, s, owner, store.UsageCounts{"messages_in": 1}, later)
}

// testUsageConcurrent: adds from many callers at once (nodes) lose none.
func testUsageConcurrent(t *testing.T, s store.Store) {
	owner := name(t, "acme")
	now := time.UnixMilli(1_700_000_000_000)
	const callers, each = 8, 25
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				if err := s.AddUsage(t.Context(), map[string]store.UsageCounts{owner: {"messages_in": 1, "messages_out": 2}}, now, time.Minute); err != nil {
					t.Errorf("AddUsage: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	wantUsage(t, s, owner, store.UsageCounts{"messages_in": callers * each, "messages_out": 2 * callers * each}, now)
}
