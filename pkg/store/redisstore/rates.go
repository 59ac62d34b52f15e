package redisstore

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// The windowed counters of store.Rates: P rate:{K}:<end> counts key K's
// window that ends at <end> (unix ms of the Store's clock, windows
// aligned to multiples of their length), so a window that is over is
// another key and counts from zero; each key expires, by Redis's clock, a
// window after its end. One key, one hash tag: one slot of a Redis Cluster.

// takeRateScript adds to a window's count when it stays within the limit
// and gives the key its expiry once. KEYS: the counter. ARGV: n, limit,
// expiry ms. Reply: {1 taken or 0 refused, the count}.
var takeRateScript = redis.NewScript(`
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
local n = tonumber(ARGV[1])
if c + n > tonumber(ARGV[2]) then
  return {0, c}
end
c = redis.call('INCRBY', KEYS[1], n)
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, c}
`)

var errBadWindow = errors.New("redisstore: the window must be positive")

// TakeRate adds n to key's count of the window that holds now if it stays
// at most limit.
func (s *Store) TakeRate(ctx context.Context, key string, n, limit int64, window time.Duration) (bool, int64, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, 0, opErr("TakeRate", err)
	}
	if window <= 0 {
		return false, 0, 0, errBadWindow
	}
	now := s.clock.Now()
	end := store.WindowEnd(now, window)
	left := end.Sub(now)
	k := s.prefix + "rate:{" + key + "}:" + strconv.FormatInt(end.UnixMilli(), 10)
	r, err := takeRateScript.Run(ctx, s.rdb, []string{k}, n, limit, ms(left+window)).Slice()
	if err != nil {
		return false, 0, 0, s.redisErr(ctx, "TakeRate", err)
	}
	ok, err := replyInt(r, 0)
	if err != nil {
		return false, 0, 0, opErr("TakeRate", err)
	}
	c, err := replyInt(r, 1)
	if err != nil {
		return false, 0, 0, opErr("TakeRate", err)
	}
	return ok == 1, c, left, nil
}
