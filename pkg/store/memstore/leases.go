package memstore

import (
	"context"
	"sync"
	"time"
)

// leases are the counted semaphores of store.Leases: by key, each holder's
// deadline. A key without live leases is removed, so the map holds only
// keys somebody holds.
type leases struct {
	mu   sync.Mutex
	keys map[string]map[string]time.Time
}

// live returns key's leases after removing those expired at now; nil when
// it has none.
func (l *leases) live(key string, now time.Time) map[string]time.Time {
	held := l.keys[key]
	for id, at := range held {
		if expired(at, now) {
			delete(held, id)
		}
	}
	if len(held) == 0 {
		delete(l.keys, key)
		return nil
	}
	return held
}

// hold returns key's live leases, making an empty set for it.
func (l *leases) hold(key string, now time.Time) map[string]time.Time {
	held := l.live(key, now)
	if held == nil {
		if l.keys == nil {
			l.keys = make(map[string]map[string]time.Time)
		}
		held = make(map[string]time.Time)
		l.keys[key] = held
	}
	return held
}

// expire removes every lease expired at now.
func (l *leases) expire(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.keys {
		l.live(key, now)
	}
}

// AcquireLease takes a lease of key for id if key has fewer than limit.
func (s *Store) AcquireLease(ctx context.Context, key, id string, limit int, ttl time.Duration) (bool, int, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	if ttl <= 0 {
		return false, 0, errBadTTL
	}
	now := s.clock.Now()
	l := &s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.hold(key, now)
	if _, ok := held[id]; !ok && len(held) >= limit {
		n := len(held)
		l.live(key, now) // drops the empty set made for a limit below 1
		return false, n, nil
	}
	held[id] = now.Add(ttl)
	return true, len(held), nil
}

// RenewLeases makes each of ids hold a lease of key for ttl from now.
func (s *Store) RenewLeases(ctx context.Context, key string, ids []string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if len(ids) == 0 {
		return nil
	}
	now := s.clock.Now()
	l := &s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	held := l.hold(key, now)
	for _, id := range ids {
		held[id] = now.Add(ttl)
	}
	return nil
}

// ReleaseLease ends id's lease of key.
func (s *Store) ReleaseLease(ctx context.Context, key, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l := &s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if held := l.keys[key]; held != nil {
		delete(held, id)
		l.live(key, s.clock.Now())
	}
	return nil
}

// LeaseCount returns how many live leases key has.
func (s *Store) LeaseCount(ctx context.Context, key string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	l := &s.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.live(key, s.clock.Now())), nil
}
