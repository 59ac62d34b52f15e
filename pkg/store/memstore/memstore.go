// Package memstore is the in-process store.Store: the state of a gateway that
// runs as one process, without Redis.
//
// Each concern (dedup keys, uploads, prompts, owners, outboxes, blobs) keeps
// its own maps under its own mutex. AckOutbox is the one method that holds
// two: the owners' mutex, then the outboxes' (it removes items only while
// the reader still owns the device); no method takes them in the other
// order.
//
// Expired items are removed lazily by the next call that touches their concern
// and by a background sweeper (stopped by Close), so items nobody asks for
// again do not accumulate. Items that expire are kept in min-heaps ordered by
// deadline, so removing them costs O(log n) each. Expired prompt cards are the
// one exception: they stay until TakeExpired hands them out, because that is
// how the router learns that a card timed out.
//
// Memory is bounded by Options.MaxBlobBytes (blobs) and Options.MaxDedupKeys
// (dedup keys); upload buffers are bounded per device by the caller's
// store.UploadLimits, outboxes per device by PushOutbox's limits and in all
// by Options.MaxOutboxBytes (what they cost in memory, see cost.go) as
// well as the limits' MaxStoreBytes, and histories per session by
// AppendHistory's limits.
package memstore

import (
	"errors"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Defaults for the zero Options.
const (
	DefaultMaxBlobBytes  = 1 << 30 // 1 GiB
	DefaultMaxDedupKeys  = 1_000_000
	DefaultSweepInterval = time.Second
)

// errBadTTL rejects a ttl that is zero or negative: nothing would be kept.
var errBadTTL = errors.New("memstore: ttl must be positive")

// Options bound the memory a Store may hold. The zero value is usable.
type Options struct {
	// MaxBlobBytes bounds the total size of the live (unexpired) blobs. A
	// PutBlob that would take the total above it fails with store.ErrFull;
	// exactly MaxBlobBytes is allowed. Zero or negative means
	// DefaultMaxBlobBytes (1 GiB).
	MaxBlobBytes int64
	// MaxDedupKeys bounds the number of recorded dedup keys. A Claim that
	// records one key more evicts the oldest keys first (oldest by their first
	// Claim), so a message repeated after MaxDedupKeys newer ones may be
	// delivered twice. Zero or negative means DefaultMaxDedupKeys (1,000,000).
	MaxDedupKeys int
	// MaxOutboxBytes bounds the memory every outbox together takes: each
	// item counts its bytes as allocated and the structures that keep it,
	// each device, holder and share with items its own (within a few
	// percent of the heap they take). A push past it drops the largest
	// holder's oldest items, as past store.OutboxLimits.MaxStoreBytes
	// (which counts the items' lengths only, and bounds too), counted
	// in OutboxDrops.Store. Zero means DefaultMaxOutboxBytes() (an eighth of
	// the memory available to the process, at most 1 GiB); negative, no
	// bound but MaxStoreBytes.
	MaxOutboxBytes int64
	// SweepInterval is how often the background sweeper removes expired
	// items. Zero or negative means DefaultSweepInterval (1 s).
	SweepInterval time.Duration
	// Clock tells the time every deadline is set and checked by (the
	// sweeper's interval stays real time). Nil means the system clock.
	Clock clock.Clock
}

// Store keeps everything in memory. Create it with New and stop its sweeper
// with Close. All methods are safe for concurrent use.
type Store struct {
	dedup   dedup
	uploads uploads
	prompts prompts
	owners  owners
	outbox  outboxes
	blobs   blobs
	events  eventLog
	// otherEvents are the event logs other than "" (owners').
	otherEvents eventLogs
	history     histories
	pushTo      pushTargets
	leases      leases
	rates       rates
	usage       usage

	journals journals

	clock     clock.Clock
	done      chan struct{} // closed by Close to stop the sweeper
	swept     chan struct{} // closed when the sweeper has returned
	closeOnce sync.Once
}

var _ store.Store = (*Store)(nil)

// New returns an empty Store and starts its sweeper.
func New(opts Options) *Store {
	if opts.MaxBlobBytes <= 0 {
		opts.MaxBlobBytes = DefaultMaxBlobBytes
	}
	if opts.MaxDedupKeys <= 0 {
		opts.MaxDedupKeys = DefaultMaxDedupKeys
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	switch {
	case opts.MaxOutboxBytes == 0:
		opts.MaxOutboxBytes = DefaultMaxOutboxBytes()
	case opts.MaxOutboxBytes < 0:
		opts.MaxOutboxBytes = 0
	}
	s := &Store{
		clock:   clock.Or(opts.Clock),
		dedup:   newDedup(opts.MaxDedupKeys),
		uploads: newUploads(),
		prompts: newPrompts(),
		owners:  newOwners(),
		outbox:  newOutboxes(opts.MaxOutboxBytes),
		blobs:   newBlobs(opts.MaxBlobBytes),
		history: newHistories(),
		done:    make(chan struct{}),
		swept:   make(chan struct{}),
	}
	go s.sweep(opts.SweepInterval)
	return s
}

// Close stops the sweeper and waits for it. The Store keeps working after
// Close, expiring items only lazily. Close is idempotent and returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { close(s.done) })
	<-s.swept
	return nil
}

// sweep removes expired items every interval until Close.
func (s *Store) sweep(interval time.Duration) {
	defer close(s.swept)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
			s.expire(s.clock.Now())
		}
	}
}

// expire removes every item whose deadline is not after now, prompt cards
// excepted (see the package comment).
func (s *Store) expire(now time.Time) {
	s.dedup.expire(now)
	s.owners.expire(now)
	s.outbox.expire(now)
	s.blobs.expire(now)
	s.history.expire(now)
	s.journals.expire(now)
	s.pushTo.expire(now)
	s.leases.expire(now)
	s.rates.expire(now)
}
