package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// reserveBlobScript counts a new blob against MaxBlobBytes, after forgetting
// the blobs whose deadline passed (Redis expires a key once its deadline is
// behind the clock, so they are forgotten together).
// KEYS: {blobs}:due, {blobs}:bytes. ARGV: member "<size>:<key>", size, ttl ms,
// max. Reply: {1, total, deadline ms} reserved, {0, total} refused.
var reserveBlobScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = '(' .. string.format('%.0f', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', past)
if #gone > 0 then
	local freed = 0
	for _, m in ipairs(gone) do
		freed = freed + tonumber(string.match(m, '^(%d+):'))
	end
	redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', past)
	redis.call('DECRBY', KEYS[2], freed)
end
local size, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local total = tonumber(redis.call('GET', KEYS[2]) or '0') + size
if total > tonumber(ARGV[4]) then
	return {0, total}
end
local deadline = now + ttl
redis.call('INCRBY', KEYS[2], size)
redis.call('ZADD', KEYS[1], string.format('%.0f', deadline), ARGV[1])
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl + 1 then
		redis.call('PEXPIRE', k, ttl + 1)
	end
end
return {1, total, deadline}
`)

// unreserveBlobScript takes back a reservation whose blob was not stored.
// KEYS: {blobs}:due, {blobs}:bytes. ARGV: member, size.
var unreserveBlobScript = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
	redis.call('DECRBY', KEYS[2], ARGV[2])
end
return 0
`)

// PutBlob stores data for ttl under a new random key. With
// Options.MaxBlobBytes it fails with store.ErrFull when the live blobs would
// exceed it; exactly MaxBlobBytes is allowed.
func (s *Store) PutBlob(ctx context.Context, data []byte, ttl time.Duration) (string, error) {
	return s.PutBlobIn(ctx, "", data, ttl)
}

// PutBlobIn is PutBlob of a key of space (store.BlobKeyIn).
func (s *Store) PutBlobIn(ctx context.Context, space string, data []byte, ttl time.Duration) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", opErr("PutBlob", err)
	}
	if ttl <= 0 {
		return "", errBadTTL
	}
	key := store.BlobKeyIn(space, newBlobKey())
	// NX: a key is 128 random bits, but a collision must not overwrite.
	set := redis.SetArgs{Mode: "NX", TTL: time.Duration(ms(ttl)) * time.Millisecond}
	var member string
	var shard int
	if s.maxBlobBytes > 0 {
		member = strconv.Itoa(len(data)) + ":" + key
		var deadline int64
		var err error
		if shard, deadline, err = s.reserveBlob(ctx, key, member, len(data), ttl); err != nil {
			return "", err
		}
		// The blob expires when the accounting forgets it.
		set.TTL, set.ExpireAt = 0, time.UnixMilli(deadline)
	}
	err := s.rdb.SetArgs(ctx, s.blobKey(key), data, set).Err()
	if err != nil {
		if member != "" {
			// Best effort: a reservation not taken back ends with its ttl.
			unreserveBlobScript.Run(ctx, s.rdb, []string{s.blobDueKey(shard), s.blobBytesKey(shard)}, member, len(data))
		}
		if errors.Is(err, redis.Nil) {
			return "", opErr("PutBlob", errors.New("random blob key already in use"))
		}
		return "", s.redisErr(ctx, "PutBlob", err)
	}
	return key, nil
}

// reserveBlob counts a blob of size bytes in a shard of the accounting. On
// a single server the one shard holds MaxBlobBytes; on Redis Cluster each
// of the Shards may hold MaxBlobBytes/Shards (rounded up), so together they
// never hold more than MaxBlobBytes plus Shards-1 bytes, and a blob larger
// than a shard's part is refused. The blob's own shard is asked first, then
// the others in turn; only when none has room is the blob refused. It returns the shard and the blob's
// deadline (Redis clock, unix ms).
func (s *Store) reserveBlob(ctx context.Context, key, member string, size int, ttl time.Duration) (shard int, deadline int64, err error) {
	n := len(s.tags.blobs)
	limit := (s.maxBlobBytes + int64(n) - 1) / int64(n)
	first := s.tags.blobs.of(key)
	var total int64
	for i := range n {
		shard = (first + i) % n
		r, err := reserveBlobScript.Run(ctx, s.rdb, []string{s.blobDueKey(shard), s.blobBytesKey(shard)},
			member, size, ms(ttl), limit).Slice()
		if err != nil {
			return 0, 0, s.redisErr(ctx, "PutBlob", err)
		}
		ok, err1 := replyInt(r, 0)
		n, err2 := replyInt(r, 1)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, opErr("PutBlob", err)
		}
		if ok == 1 {
			deadline, err := replyInt(r, 2)
			if err != nil {
				return 0, 0, opErr("PutBlob", err)
			}
			return shard, deadline, nil
		}
		total += n - int64(size)
	}
	return 0, 0, fmt.Errorf("%w: %d blob bytes, limit %d", store.ErrFull, total+int64(size), s.maxBlobBytes)
}

// extendKeyScript makes a key live at least ttl from now.
// KEYS: key. ARGV: ttl ms. Reply: the key's length (STRLEN), -1 when gone.
var extendKeyScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
	return -1
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
	redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return redis.call('STRLEN', KEYS[1])
`)

// extendBlobDueScript moves a blob's deadline in a shard of the blob
// accounting to at least ttl from now, if the shard holds it.
// KEYS: {blobs}:due, {blobs}:bytes. ARGV: member, ttl ms. Reply: 1 the
// shard holds the member, 0 not.
var extendBlobDueScript = redis.NewScript(`
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
	return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if tonumber(score) < now + ttl then
	redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[1])
end
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl + 1 then
		redis.call('PEXPIRE', k, ttl + 1)
	end
end
return 1
`)

// ExtendBlob makes key live at least ttl from now, and with MaxBlobBytes
// keeps it counted that long: the blob's key first, then its member in the
// accounting (looked for from the key's own shard on, as PutBlob placed
// it). store.ErrNotFound when the blob is gone.
func (s *Store) ExtendBlob(ctx context.Context, key string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("ExtendBlob", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	size, err := extendKeyScript.Run(ctx, s.rdb, []string{s.blobKey(key)}, ms(ttl)).Int64()
	if err != nil {
		return s.redisErr(ctx, "ExtendBlob", err)
	}
	if size < 0 {
		return store.ErrNotFound
	}
	if s.maxBlobBytes <= 0 {
		return nil
	}
	member := strconv.FormatInt(size, 10) + ":" + key
	n := len(s.tags.blobs)
	first := s.tags.blobs.of(key)
	for i := range n {
		sh := (first + i) % n
		found, err := extendBlobDueScript.Run(ctx, s.rdb, []string{s.blobDueKey(sh), s.blobBytesKey(sh)}, member, ms(ttl)).Int64()
		if err != nil {
			return s.redisErr(ctx, "ExtendBlob", err)
		}
		if found == 1 {
			return nil
		}
	}
	return nil
}

// newBlobKey returns 128 random bits in hex.
func newBlobKey() string {
	var k [16]byte
	rand.Read(k[:]) // never fails (crypto/rand)
	return hex.EncodeToString(k[:])
}

// GetBlob returns the bytes of key; store.ErrNotFound when gone.
func (s *Store) GetBlob(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("GetBlob", err)
	}
	b, err := s.rdb.Get(ctx, s.blobKey(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, s.redisErr(ctx, "GetBlob", err)
	}
	return b, nil
}
