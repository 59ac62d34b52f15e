package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// blobEntry is one stored blob.
type blobEntry struct {
	expiry
	key  string
	data []byte
}

// blobs keeps media bytes, at most max bytes of live blobs in total.
type blobs struct {
	mu       sync.Mutex
	max      int64
	total    int64 // sum of len(data) over byKey
	byKey    map[string]*blobEntry
	byExpiry expiryQueue[*blobEntry]
}

func newBlobs(max int64) blobs {
	return blobs{max: max, byKey: make(map[string]*blobEntry)}
}

// PutBlob stores data for ttl under a new random key. It fails with
// store.ErrFull when the live blobs would exceed Options.MaxBlobBytes.
func (s *Store) PutBlob(ctx context.Context, data []byte, ttl time.Duration) (string, error) {
	return s.PutBlobIn(ctx, "", data, ttl)
}

// PutBlobIn is PutBlob of a key of space (store.BlobKeyIn).
func (s *Store) PutBlobIn(ctx context.Context, space string, data []byte, ttl time.Duration) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if ttl <= 0 {
		return "", errBadTTL
	}
	data = bytes.Clone(data)
	b := &s.blobs
	now := s.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(now)
	if total := b.total + int64(len(data)); total > b.max {
		return "", fmt.Errorf("%w: %d blob bytes, limit %d", store.ErrFull, total, b.max)
	}
	key := store.BlobKeyIn(space, newBlobKey())
	for b.byKey[key] != nil {
		key = store.BlobKeyIn(space, newBlobKey())
	}
	e := &blobEntry{expiry: expiry{at: now.Add(ttl)}, key: key, data: data}
	b.byKey[key] = e
	b.byExpiry.add(e)
	b.total += int64(len(data))
	return key, nil
}

// newBlobKey returns 128 random bits in hex.
func newBlobKey() string {
	var k [16]byte
	rand.Read(k[:]) // never fails (crypto/rand)
	return hex.EncodeToString(k[:])
}

// GetBlob returns a copy of the bytes of key; store.ErrNotFound when gone.
func (s *Store) GetBlob(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := &s.blobs
	now := s.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(now)
	e, ok := b.byKey[key]
	if !ok {
		return nil, store.ErrNotFound
	}
	return bytes.Clone(e.data), nil
}

// ExtendBlob makes key live at least ttl from now; store.ErrNotFound when
// gone.
func (s *Store) ExtendBlob(ctx context.Context, key string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return errBadTTL
	}
	b := &s.blobs
	now := s.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(now)
	e, ok := b.byKey[key]
	if !ok {
		return store.ErrNotFound
	}
	if at := now.Add(ttl); at.After(e.at) {
		e.at = at
		b.byExpiry.fix(e)
	}
	return nil
}

func (b *blobs) expire(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireLocked(now)
}

func (b *blobs) expireLocked(now time.Time) {
	for {
		e, ok := b.byExpiry.popExpired(now)
		if !ok {
			return
		}
		delete(b.byKey, e.key)
		b.total -= int64(len(e.data))
	}
}

// size reports the bytes held, expired blobs included until they are swept.
func (b *blobs) size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
