package memstore

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// outboxItem is one queued frame and the time it is forgotten.
type outboxItem struct {
	data []byte
	at   time.Time
}

// outbox is the queue of one device. Its deadline is the latest deadline of
// its items: once it passes, the whole outbox is forgotten.
type outbox struct {
	expiry
	device string
	items  []outboxItem // oldest first
}

// outboxes keeps the queues of offline devices.
type outboxes struct {
	mu       sync.Mutex
	byDevice map[string]*outbox
	byExpiry expiryQueue[*outbox]
}

func newOutboxes() outboxes {
	return outboxes{byDevice: make(map[string]*outbox)}
}

// PushOutbox appends item to device's outbox. Each item is forgotten ttl after
// its push; the outbox keeps at most max items (none when max < 1), dropping
// the oldest.
func (s *Store) PushOutbox(ctx context.Context, device string, item []byte, max int, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	item = bytes.Clone(item)
	q := &s.outbox
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
	b, ok := q.byDevice[device]
	if !ok {
		b = &outbox{device: device}
	}
	for len(b.items) > 0 && expired(b.items[0].at, now) {
		b.dropOldest()
	}
	b.items = append(b.items, outboxItem{data: item, at: now.Add(ttl)})
	for len(b.items) > max && len(b.items) > 0 {
		b.dropOldest()
	}
	switch {
	case len(b.items) == 0:
		if ok {
			q.removeLocked(b)
		}
	case !ok:
		b.at = now.Add(ttl)
		q.byDevice[device] = b
		q.byExpiry.add(b)
	case now.Add(ttl).After(b.at):
		b.at = now.Add(ttl)
		q.byExpiry.fix(b)
	}
	return nil
}

// dropOldest removes the first item and lets its bytes be collected.
func (b *outbox) dropOldest() {
	b.items[0] = outboxItem{}
	b.items = b.items[1:]
}

// TakeOutbox removes and returns device's live items, oldest first.
func (s *Store) TakeOutbox(ctx context.Context, device string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &s.outbox
	now := time.Now()
	q.mu.Lock()
	b, ok := q.byDevice[device]
	if ok {
		q.removeLocked(b)
	}
	q.mu.Unlock()
	if !ok {
		return nil, nil
	}
	out := make([][]byte, 0, len(b.items))
	for _, it := range b.items {
		if !expired(it.at, now) {
			out = append(out, it.data)
		}
	}
	return out, nil
}

func (q *outboxes) removeLocked(b *outbox) {
	delete(q.byDevice, b.device)
	q.byExpiry.remove(b)
}

func (q *outboxes) expire(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.expireLocked(now)
}

// expireLocked forgets the outboxes whose items have all expired.
func (q *outboxes) expireLocked(now time.Time) {
	for {
		b, ok := q.byExpiry.popExpired(now)
		if !ok {
			return
		}
		delete(q.byDevice, b.device)
	}
}

// len reports the outboxes, expired ones included until they are swept.
func (q *outboxes) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byDevice)
}
