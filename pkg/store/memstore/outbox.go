package memstore

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// outboxItem is one queued frame, its sequence number and the time it is
// forgotten.
type outboxItem struct {
	seq  int64
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

// outboxes keeps the queues of offline devices. Sequence numbers come from
// one counter for all devices, so a device's numbers keep growing when its
// outbox is emptied and made again.
type outboxes struct {
	mu       sync.Mutex
	seq      int64 // the last sequence number handed out
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
	now := s.clock.Now()
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
	q.seq++
	b.items = append(b.items, outboxItem{seq: q.seq, data: item, at: now.Add(ttl)})
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

// PeekOutbox returns device's live items whose Seq is greater than after,
// oldest first, and leaves them in place.
func (s *Store) PeekOutbox(ctx context.Context, device string, after int64) ([]store.OutboxItem, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &s.outbox
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	b, ok := q.byDevice[device]
	if !ok {
		return nil, nil
	}
	var out []store.OutboxItem
	for _, it := range b.items {
		if it.seq > after && !expired(it.at, now) {
			out = append(out, store.OutboxItem{Seq: it.seq, Data: bytes.Clone(it.data)})
		}
	}
	return out, nil
}

// AckOutbox removes device's items up to Seq upTo if device's owner record
// holds epoch. It holds the owners' mutex, then the outbox's, so no claim
// of the device can come between the check and the removal.
func (s *Store) AckOutbox(ctx context.Context, device string, epoch, upTo int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	o, q := &s.owners, &s.outbox
	now := s.clock.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	if e, ok := o.byDevice[device]; !ok || e.owner.Epoch != epoch {
		return false, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	b, ok := q.byDevice[device]
	if !ok {
		return true, nil
	}
	for len(b.items) > 0 && (b.items[0].seq <= upTo || expired(b.items[0].at, now)) {
		b.dropOldest()
	}
	if len(b.items) == 0 {
		q.removeLocked(b)
	}
	return true, nil
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
