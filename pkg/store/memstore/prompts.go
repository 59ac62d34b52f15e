package memstore

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// promptEntry is one open card; its deadline is the card's Expires.
type promptEntry struct {
	expiry
	rec store.PromptRecord
}

// prompts keeps open cards. Expired cards stay until TakeExpired returns
// them: the sweeper leaves them alone.
type prompts struct {
	mu       sync.Mutex
	byID     map[string]*promptEntry
	byExpiry expiryQueue[*promptEntry]
}

func newPrompts() prompts {
	return prompts{byID: make(map[string]*promptEntry)}
}

// PutPrompt stores p until p.Expires, replacing a card with the same id.
func (s *Store) PutPrompt(ctx context.Context, p store.PromptRecord) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.Data = bytes.Clone(p.Data)
	q := &s.prompts
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.byID[p.ID]; ok {
		e.rec, e.at = p, p.Expires
		q.byExpiry.fix(e)
		return nil
	}
	e := &promptEntry{expiry: expiry{at: p.Expires}, rec: p}
	q.byID[p.ID] = e
	q.byExpiry.add(e)
	return nil
}

// TakePrompt removes and returns card id if device owns it. An expired card
// is store.ErrNotFound and stays for TakeExpired, so that its expiry is still
// reported.
func (s *Store) TakePrompt(ctx context.Context, id, device string) (store.PromptRecord, error) {
	if err := ctx.Err(); err != nil {
		return store.PromptRecord{}, err
	}
	now := s.clock.Now()
	q := &s.prompts
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.byID[id]
	if !ok || expired(e.at, now) {
		return store.PromptRecord{}, store.ErrNotFound
	}
	if e.rec.Device != device {
		return store.PromptRecord{}, store.ErrForbidden
	}
	delete(q.byID, id)
	q.byExpiry.remove(e)
	return e.rec, nil
}

// TakeExpired removes and returns up to max cards whose Expires is not after
// now, earliest first.
func (s *Store) TakeExpired(ctx context.Context, now time.Time, max int) ([]store.PromptRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &s.prompts
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []store.PromptRecord
	for len(out) < max {
		e, ok := q.byExpiry.popExpired(now)
		if !ok {
			break
		}
		delete(q.byID, e.rec.ID)
		out = append(out, e.rec)
	}
	return out, nil
}
