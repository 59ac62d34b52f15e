package memstore

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// history is the conversation of one session; its deadline is TTL after its
// last append.
type history struct {
	expiry
	session string
	items   [][]byte // oldest first
	bytes   int      // the sum of len(items[i])
}

// histories keeps the conversations of every session.
type histories struct {
	mu        sync.Mutex
	bySession map[string]*history
	byExpiry  expiryQueue[*history]
}

func newHistories() histories {
	return histories{bySession: make(map[string]*history)}
}

// AppendHistory appends items to session's history, then drops the oldest
// items beyond lim.MaxItems and lim.MaxBytes; see store.History.
func (s *Store) AppendHistory(ctx context.Context, session string, items [][]byte, lim store.HistoryLimits) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lim.TTL <= 0 {
		return errBadTTL
	}
	q := &s.history
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
	h, ok := q.bySession[session]
	if !ok {
		h = &history{session: session}
	}
	for _, it := range items {
		h.items = append(h.items, bytes.Clone(it))
		h.bytes += len(it)
	}
	for len(h.items) > 0 && (len(h.items) > lim.MaxItems || h.bytes > lim.MaxBytes) {
		h.bytes -= len(h.items[0])
		h.items[0] = nil
		h.items = h.items[1:]
	}
	switch {
	case len(h.items) == 0:
		if ok {
			q.removeLocked(h)
		}
	case !ok:
		h.at = now.Add(lim.TTL)
		q.bySession[session] = h
		q.byExpiry.add(h)
	default:
		h.at = now.Add(lim.TTL)
		q.byExpiry.fix(h)
	}
	return nil
}

// History returns session's items, oldest first.
func (s *Store) History(ctx context.Context, session string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &s.history
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(s.clock.Now())
	h, ok := q.bySession[session]
	if !ok {
		return nil, nil
	}
	out := make([][]byte, len(h.items))
	for i, it := range h.items {
		out[i] = bytes.Clone(it)
	}
	return out, nil
}

func (q *histories) removeLocked(h *history) {
	delete(q.bySession, h.session)
	q.byExpiry.remove(h)
}

func (q *histories) expire(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
}

// expireLocked forgets the histories whose deadline has passed.
func (q *histories) expireLocked(now time.Time) {
	for {
		h, ok := q.byExpiry.popExpired(now)
		if !ok {
			return
		}
		delete(q.bySession, h.session)
	}
}
