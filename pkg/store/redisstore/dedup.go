package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// claimScript records the attempt unless the key is held, and reports
// whether the attempt holds it (a retry after a lost reply holds it too).
// KEYS: dedup key. ARGV: attempt, ttl ms. Reply: 1 held, 0 a duplicate.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return 1
end
return 0
`)

// releaseScript deletes the key if the attempt holds it.
// KEYS: dedup key. ARGV: attempt. Reply: 1 deleted, 0 not.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
`)

// Claim records key for ttl and reports whether attempt holds its first
// delivery; see store.Dedup. A retry with the holding attempt does not extend
// the ttl.
func (s *Store) Claim(ctx context.Context, key, attempt string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("Claim", err)
	}
	if ttl <= 0 {
		return false, errBadTTL
	}
	n, err := claimScript.Run(ctx, s.rdb, []string{s.dedupKey(key)}, attempt, ms(ttl)).Int64()
	if err != nil {
		return false, redisErr(ctx, "Claim", err)
	}
	return n == 1, nil
}

// Release forgets key if attempt still holds it.
func (s *Store) Release(ctx context.Context, key, attempt string) error {
	if err := ctx.Err(); err != nil {
		return opErr("Release", err)
	}
	if err := releaseScript.Run(ctx, s.rdb, []string{s.dedupKey(key)}, attempt).Err(); err != nil {
		return redisErr(ctx, "Release", err)
	}
	return nil
}

// Seen reports whether key is recorded.
func (s *Store) Seen(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("Seen", err)
	}
	n, err := s.rdb.Exists(ctx, s.dedupKey(key)).Result()
	if err != nil {
		return false, redisErr(ctx, "Seen", err)
	}
	return n == 1, nil
}
