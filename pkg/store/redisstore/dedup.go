package redisstore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// A dedup key holds the attempt that claimed it while pending, and "!"
// followed by the attempt once confirmed (attempts never begin with "!").

// claimScript records the attempt as pending unless the key is held, and
// reports whether the attempt holds it (a retry after a lost reply holds it
// too). KEYS: dedup key. ARGV: attempt, ttl ms. Reply: 1 held, 0 a duplicate
// (confirmed), 2 pending by another attempt.
var claimScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return 1
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
	return 1
end
if string.sub(v, 1, 1) == '!' then
	return 0
end
return 2
`)

// confirmScript records the key as confirmed by the attempt unless it is
// confirmed or pending by another attempt. KEYS: dedup key. ARGV: attempt,
// ttl ms.
var confirmScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
	redis.call('SET', KEYS[1], '!' .. ARGV[1], 'PX', ARGV[2])
end
return 0
`)

// releaseScript deletes the key if the attempt holds it pending.
// KEYS: dedup key. ARGV: attempt. Reply: 1 deleted, 0 not.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
`)

// Claim records key as pending for ttl; see store.Dedup. A retry with the
// holding attempt does not extend the ttl.
func (s *Store) Claim(ctx context.Context, key, attempt string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("Claim", err)
	}
	if ttl <= 0 {
		return false, errBadTTL
	}
	n, err := claimScript.Run(ctx, s.rdb, []string{s.dedupKey(key)}, attempt, ms(ttl)).Int64()
	switch {
	case err != nil:
		return false, s.redisErr(ctx, "Claim", err)
	case n == 2:
		return false, store.ErrPending
	}
	return n == 1, nil
}

// Confirm records key as delivered for ttl; see store.Dedup.
func (s *Store) Confirm(ctx context.Context, key, attempt string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("Confirm", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := confirmScript.Run(ctx, s.rdb, []string{s.dedupKey(key)}, attempt, ms(ttl)).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return s.redisErr(ctx, "Confirm", err)
	}
	return nil
}

// Release forgets key if attempt still holds it.
func (s *Store) Release(ctx context.Context, key, attempt string) error {
	if err := ctx.Err(); err != nil {
		return opErr("Release", err)
	}
	if err := releaseScript.Run(ctx, s.rdb, []string{s.dedupKey(key)}, attempt).Err(); err != nil {
		return s.redisErr(ctx, "Release", err)
	}
	return nil
}

// Seen reports whether key is confirmed.
func (s *Store) Seen(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("Seen", err)
	}
	v, err := s.rdb.Get(ctx, s.dedupKey(key)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, s.redisErr(ctx, "Seen", err)
	}
	return strings.HasPrefix(v, "!"), nil
}
