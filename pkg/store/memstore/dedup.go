package memstore

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// dedupEntry is one recorded key.
type dedupEntry struct {
	expiry
	key     string
	attempt string        // the delivery attempt that holds key
	done    bool          // confirmed: delivered
	age     *list.Element // place in dedup.fifo
}

// dedup records keys until they expire or, beyond max keys, until they are
// the oldest.
type dedup struct {
	mu       sync.Mutex
	max      int
	keys     map[string]*dedupEntry
	byExpiry expiryQueue[*dedupEntry]
	fifo     *list.List // of *dedupEntry, oldest first Claim at the front
}

func newDedup(max int) dedup {
	return dedup{max: max, keys: make(map[string]*dedupEntry), fifo: list.New()}
}

// Claim records key as pending for ttl; see store.Dedup. When more than
// Options.MaxDedupKeys keys would be recorded, the oldest are forgotten.
func (s *Store) Claim(ctx context.Context, key, attempt string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if ttl <= 0 {
		return false, errBadTTL
	}
	d := &s.dedup
	now := s.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expireLocked(now)
	if e, ok := d.keys[key]; ok {
		switch {
		case e.done:
			return false, nil
		case e.attempt == attempt:
			return true, nil
		}
		return false, store.ErrPending
	}
	d.addLocked(key, attempt, now.Add(ttl))
	return true, nil
}

// Confirm records key as delivered for ttl; see store.Dedup.
func (s *Store) Confirm(ctx context.Context, key, attempt string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	d := &s.dedup
	now := s.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expireLocked(now)
	e, ok := d.keys[key]
	switch {
	case !ok:
		e = d.addLocked(key, attempt, now.Add(ttl))
	case e.done || e.attempt != attempt:
		return nil
	default:
		e.at = now.Add(ttl)
		d.byExpiry.fix(e)
	}
	e.done = true
	return nil
}

// addLocked records key for attempt until at, forgetting the oldest keys
// past the bound.
func (d *dedup) addLocked(key, attempt string, at time.Time) *dedupEntry {
	e := &dedupEntry{expiry: expiry{at: at}, key: key, attempt: attempt}
	d.keys[key] = e
	d.byExpiry.add(e)
	e.age = d.fifo.PushBack(e)
	for len(d.keys) > d.max {
		d.removeLocked(d.fifo.Front().Value.(*dedupEntry))
	}
	return e
}

// Release forgets key if attempt still holds it.
func (s *Store) Release(ctx context.Context, key, attempt string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := &s.dedup
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.keys[key]; ok && e.attempt == attempt && !e.done {
		d.removeLocked(e)
	}
	return nil
}

// Seen reports whether key is confirmed.
func (s *Store) Seen(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	d := &s.dedup
	now := s.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expireLocked(now)
	e, ok := d.keys[key]
	return ok && e.done, nil
}

func (d *dedup) expire(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expireLocked(now)
}

// expireLocked forgets the keys expired at now.
func (d *dedup) expireLocked(now time.Time) {
	for {
		e, ok := d.byExpiry.popExpired(now)
		if !ok {
			return
		}
		delete(d.keys, e.key)
		d.fifo.Remove(e.age)
	}
}

func (d *dedup) removeLocked(e *dedupEntry) {
	delete(d.keys, e.key)
	d.byExpiry.remove(e)
	d.fifo.Remove(e.age)
}

// len reports the recorded keys, expired ones included until they are swept.
func (d *dedup) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.keys)
}
