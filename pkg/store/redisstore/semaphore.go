package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The counted semaphores of store.Leases: P lease:{K} is a sorted set of
// the holders' ids scored by their leases' deadlines (unix ms of the
// Store's clock, so a test's fake clock expires them). Each script first
// removes the expired, then counts, on the one key, so it is atomic across
// nodes and its one hash tag ({K}) puts it on one slot of a Redis Cluster.
// The key lives (by Redis's clock) at least as long as its longest lease,
// so a semaphore nobody renews is gone with its leases.

// acquireLeaseScript takes a lease for an id that holds one or when there
// are fewer than limit. KEYS: the set. ARGV: now ms, deadline ms, id,
// limit, ttl ms. Reply: {1 taken or 0 refused, leases held}.
var acquireLeaseScript = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not mine and n >= tonumber(ARGV[4]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
if not mine then n = n + 1 end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return {1, n}
`)

// renewLeasesScript gives each id a lease until the deadline. KEYS: the
// set. ARGV: now ms, deadline ms, ttl ms, ids….
var renewLeasesScript = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for i = 4, #ARGV do
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i])
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
`)

func (s *Store) semaphoreKey(key string) string { return s.prefix + "lease:{" + key + "}" }

// unixMs is t in unix milliseconds, as the sets score deadlines.
func unixMs(t time.Time) int64 { return t.UnixMilli() }

// AcquireLease takes a lease of key for id if key has fewer than limit.
func (s *Store) AcquireLease(ctx context.Context, key, id string, limit int, ttl time.Duration) (bool, int, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, opErr("AcquireLease", err)
	}
	if ttl <= 0 {
		return false, 0, errBadTTL
	}
	now := s.clock.Now()
	r, err := acquireLeaseScript.Run(ctx, s.rdb, []string{s.semaphoreKey(key)},
		unixMs(now), unixMs(now)+ms(ttl), id, limit, ms(ttl)).Slice()
	if err != nil {
		return false, 0, s.redisErr(ctx, "AcquireLease", err)
	}
	ok, err := replyInt(r, 0)
	if err != nil {
		return false, 0, opErr("AcquireLease", err)
	}
	held, err := replyInt(r, 1)
	if err != nil {
		return false, 0, opErr("AcquireLease", err)
	}
	return ok == 1, int(held), nil
}

// RenewLeases makes each of ids hold a lease of key for ttl from now.
func (s *Store) RenewLeases(ctx context.Context, key string, ids []string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("RenewLeases", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if len(ids) == 0 {
		return nil
	}
	now := s.clock.Now()
	args := make([]any, 0, 3+len(ids))
	args = append(args, unixMs(now), unixMs(now)+ms(ttl), ms(ttl))
	for _, id := range ids {
		args = append(args, id)
	}
	if err := renewLeasesScript.Run(ctx, s.rdb, []string{s.semaphoreKey(key)}, args...).Err(); err != nil {
		return s.redisErr(ctx, "RenewLeases", err)
	}
	return nil
}

// ReleaseLease ends id's lease of key.
func (s *Store) ReleaseLease(ctx context.Context, key, id string) error {
	if err := ctx.Err(); err != nil {
		return opErr("ReleaseLease", err)
	}
	if err := s.rdb.ZRem(ctx, s.semaphoreKey(key), id).Err(); err != nil {
		return s.redisErr(ctx, "ReleaseLease", err)
	}
	return nil
}

// LeaseCount returns how many live leases key has: the ids whose deadline
// is after now (the expired are left for the next script to remove).
func (s *Store) LeaseCount(ctx context.Context, key string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, opErr("LeaseCount", err)
	}
	n, err := s.rdb.ZCount(ctx, s.semaphoreKey(key), "("+strconv.FormatInt(unixMs(s.clock.Now()), 10), "+inf").Result()
	if err != nil {
		return 0, s.redisErr(ctx, "LeaseCount", err)
	}
	return int(n), nil
}
