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

// countRateScript adds to a window's count and gives the key its expiry
// once. KEYS: the counter. ARGV: n, expiry ms. Reply: the count.
var countRateScript = redis.NewScript(`
local c = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return c
`)

var errBadWindow = errors.New("redisstore: the window must be positive")

// CountRate adds n to key's count of the window that holds now.
func (s *Store) CountRate(ctx context.Context, key string, n int64, window time.Duration) (int64, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, opErr("CountRate", err)
	}
	if window <= 0 {
		return 0, 0, errBadWindow
	}
	now := s.clock.Now()
	end := store.WindowEnd(now, window)
	left := end.Sub(now)
	k := s.prefix + "rate:{" + key + "}:" + strconv.FormatInt(end.UnixMilli(), 10)
	c, err := countRateScript.Run(ctx, s.rdb, []string{k}, n, ms(left+window)).Int64()
	if err != nil {
		return 0, 0, s.redisErr(ctx, "CountRate", err)
	}
	return c, left, nil
}
