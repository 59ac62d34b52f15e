package store

import (
	"context"
	"fmt"
	"time"
)

// UsageCounts are an owner's counters by name (pkg/usage names them).
type UsageCounts map[string]int64

// UsageSince is the name no counter may have: Usage reports under it
// nothing, it is when the owner's counting began (see Usage).
const UsageSince = "since"

// Usage counts what each owner (tenant) used, across every node sharing
// the store: each node adds what it counted since its last add, so the
// store is written once per node and interval, not per event.
type Usage interface {
	// AddUsage adds each owner's counts to the owner's, in one round trip,
	// and keeps each owner's counts for ttl after this call (an owner
	// that uses nothing for ttl starts again from zero). An owner's
	// first add records now as its since. An owner with no counts, or
	// only zero ones, is not written. A counter named UsageSince, or
	// empty, is an error, and nothing is added.
	AddUsage(ctx context.Context, add map[string]UsageCounts, now time.Time, ttl time.Duration) error
	// Usage returns owner's counts and when they began: an empty map and
	// the zero time for an owner with none.
	Usage(ctx context.Context, owner string) (UsageCounts, time.Time, error)
}

// CheckUsage refuses counts that AddUsage does not take: a counter named
// UsageSince or empty.
func CheckUsage(add map[string]UsageCounts) error {
	for owner, counts := range add {
		for name := range counts {
			if name == "" || name == UsageSince {
				return fmt.Errorf("store: owner %q: %q is not a usage counter's name", owner, name)
			}
		}
	}
	return nil
}

// UsageWritten reports whether counts holds a count other than zero: an
// owner without one is not written.
func UsageWritten(counts UsageCounts) bool {
	for _, n := range counts {
		if n != 0 {
			return true
		}
	}
	return false
}
