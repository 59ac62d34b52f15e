package memstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// rates are the windowed counters of store.Rates: by key, the count of the
// window that ends at end. A key whose window is over counts from zero, and
// expire drops such keys, so the map holds only current windows.
type rates struct {
	mu   sync.Mutex
	keys map[string]rateWindow
}

type rateWindow struct {
	end   time.Time
	count int64
}

// expire drops every window over at now.
func (r *rates) expire(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, w := range r.keys {
		if !now.Before(w.end) {
			delete(r.keys, k)
		}
	}
}

var errBadWindow = errors.New("memstore: the window must be positive")

// TakeRate adds n to key's count of the window that holds now if it stays
// at most limit.
func (s *Store) TakeRate(ctx context.Context, key string, n, limit int64, window time.Duration) (bool, int64, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, 0, err
	}
	if window <= 0 {
		return false, 0, 0, errBadWindow
	}
	now := s.clock.Now()
	end := store.WindowEnd(now, window)
	r := &s.rates
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = make(map[string]rateWindow)
	}
	w := r.keys[key]
	if !w.end.Equal(end) {
		w = rateWindow{end: end}
	}
	if w.count+n > limit {
		return false, w.count, end.Sub(now), nil
	}
	w.count += n
	r.keys[key] = w
	return true, w.count, end.Sub(now), nil
}
