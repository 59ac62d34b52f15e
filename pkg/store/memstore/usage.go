package memstore

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// usage keeps each owner's counters. Owners are few (those of the tenants
// file), so an expired owner is dropped when it is next touched, not swept.
type usage struct {
	mu      sync.Mutex
	byOwner map[string]*ownerUsage
}

type ownerUsage struct {
	counts  store.UsageCounts
	since   time.Time
	expires time.Time
}

// AddUsage adds each owner's counts to its own.
func (s *Store) AddUsage(ctx context.Context, add map[string]store.UsageCounts, now time.Time, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := store.CheckUsage(add); err != nil {
		return err
	}
	u := &s.usage
	at := s.clock.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byOwner == nil {
		u.byOwner = make(map[string]*ownerUsage)
	}
	for owner, counts := range add {
		if !store.UsageWritten(counts) {
			continue
		}
		o := u.liveLocked(owner, at)
		if o == nil {
			o = &ownerUsage{counts: make(store.UsageCounts), since: now}
			u.byOwner[owner] = o
		}
		for name, n := range counts {
			o.counts[name] += n
		}
		o.expires = at.Add(ttl)
	}
	return nil
}

// Usage returns owner's counts and when they began.
func (s *Store) Usage(ctx context.Context, owner string) (store.UsageCounts, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, err
	}
	u := &s.usage
	u.mu.Lock()
	defer u.mu.Unlock()
	o := u.liveLocked(owner, s.clock.Now())
	if o == nil {
		return store.UsageCounts{}, time.Time{}, nil
	}
	return maps.Clone(o.counts), o.since, nil
}

// liveLocked is owner's usage, nil when it has none or it expired (then
// it is dropped).
func (u *usage) liveLocked(owner string, now time.Time) *ownerUsage {
	o := u.byOwner[owner]
	if o != nil && !now.Before(o.expires) {
		delete(u.byOwner, owner)
		return nil
	}
	return o
}
