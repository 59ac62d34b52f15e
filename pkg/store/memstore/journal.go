package memstore

import (
	"bytes"
	"context"

	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// devJournal is one device's journal and its lease.
type devJournal struct {
	entries   []store.JournalEntry // oldest first
	owner     string               // the lease holder; empty when free
	until     time.Time            // the lease deadline
	expires   time.Time            // last append + TTL
	takeovers int                  // expired leases taken while the oldest entry was the oldest
}

// held reports whether owner holds the lease at now.
func (j *devJournal) held(owner string, now time.Time) bool {
	return j.owner != "" && j.owner == owner && now.Before(j.until)
}

// free reports whether nobody holds the lease at now.
func (j *devJournal) free(now time.Time) bool {
	return j.owner == "" || !now.Before(j.until)
}

// take gives the free lease to owner until until, counting a takeover when
// the lease had expired rather than been released.
func (j *devJournal) take(owner string, now, until time.Time) {
	if j.owner != "" && !now.Before(j.until) {
		j.takeovers++
	}
	j.owner, j.until = owner, until
}

// journals keeps the journals of every device under one mutex. A journal
// is dropped when its holder finds it empty or TTL after its last append.
// Seqs count across all of them, so a dropped journal's never come back.
type journals struct {
	mu       sync.Mutex
	byDevice map[string]*devJournal
	seq      int64 // the last Seq handed out
}

// AppendJournal implements store.Journal.
func (s *Store) AppendJournal(ctx context.Context, device, owner string, data []byte, lim store.JournalLimits) (store.Appended, error) {
	if err := ctx.Err(); err != nil {
		return store.Appended{}, err
	}
	if lim.Lease <= 0 || lim.TTL <= 0 {
		return store.Appended{}, errBadTTL
	}
	data = bytes.Clone(data)
	q := &s.journals
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.getLocked(device, now)
	if len(j.entries) >= lim.MaxLen {
		return store.Appended{Leased: j.held(owner, now)}, store.ErrJournalFull
	}
	if q.byDevice == nil {
		q.byDevice = make(map[string]*devJournal)
	}
	q.byDevice[device] = j
	q.seq++
	j.entries = append(j.entries, store.JournalEntry{Seq: q.seq, Data: data})
	j.expires = now.Add(lim.TTL)
	if !j.free(now) {
		return store.Appended{Leased: j.held(owner, now)}, nil
	}
	j.take(owner, now, now.Add(lim.Lease))
	e := j.entries[0]
	return store.Appended{Leased: true, Head: &store.JournalEntry{Seq: e.Seq, Data: bytes.Clone(e.Data), Takeovers: j.takeovers}}, nil
}

// getLocked returns device's live journal, or a new empty one (not yet
// stored).
func (q *journals) getLocked(device string, now time.Time) *devJournal {
	j := q.byDevice[device]
	if j != nil && expired(j.expires, now) {
		delete(q.byDevice, device)
		j = nil
	}
	if j == nil {
		j = &devJournal{}
	}
	return j
}

// NextJournal implements store.Journal.
func (s *Store) NextJournal(ctx context.Context, device, owner string, done int64, lease time.Duration) (store.JournalEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.JournalEntry{}, false, err
	}
	if lease <= 0 {
		return store.JournalEntry{}, false, errBadTTL
	}
	q := &s.journals
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.getLocked(device, now)
	if !j.held(owner, now) {
		return store.JournalEntry{}, false, store.ErrLeaseLost
	}
	if done != 0 && len(j.entries) > 0 && j.entries[0].Seq == done {
		j.entries[0] = store.JournalEntry{}
		j.entries = j.entries[1:]
		j.takeovers = 0
	}
	if len(j.entries) == 0 {
		delete(q.byDevice, device) // released with its last entry
		return store.JournalEntry{}, false, nil
	}
	j.until = now.Add(lease)
	e := j.entries[0]
	return store.JournalEntry{Seq: e.Seq, Data: bytes.Clone(e.Data), Takeovers: j.takeovers}, true, nil
}

// RenewJournal implements store.Journal.
func (s *Store) RenewJournal(ctx context.Context, device, owner string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return errBadTTL
	}
	q := &s.journals
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.getLocked(device, now)
	if !j.held(owner, now) {
		return store.ErrLeaseLost
	}
	j.until = now.Add(lease)
	return nil
}

// ReleaseJournal implements store.Journal.
func (s *Store) ReleaseJournal(ctx context.Context, device, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q := &s.journals
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if j := q.getLocked(device, now); j.held(owner, now) {
		j.owner = ""
		if len(j.entries) == 0 {
			delete(q.byDevice, device)
		}
	}
	return nil
}

// TakeJournals implements store.Journal. It scans every journal: the map
// holds only journals with entries or a lease, so their number is bounded by
// the devices with events in flight.
func (s *Store) TakeJournals(ctx context.Context, owner string, lease time.Duration, max int) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, errBadTTL
	}
	q := &s.journals
	now := s.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for device, j := range q.byDevice {
		if len(out) >= max {
			break
		}
		if expired(j.expires, now) {
			delete(q.byDevice, device)
			continue
		}
		if len(j.entries) > 0 && j.free(now) {
			j.take(owner, now, now.Add(lease))
			out = append(out, device)
		}
	}
	return out, nil
}

func (q *journals) expire(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for device, j := range q.byDevice {
		if expired(j.expires, now) {
			delete(q.byDevice, device)
		}
	}
}
