package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// addUsageScript adds counts to an owner's hash in one step, so a reader
// never sees an owner half added and the key always has its TTL.
// KEYS[1] the hash; ARGV[1] the ttl (ms), ARGV[2] since (unix ms), then
// pairs of a counter's name and the count to add.
var addUsageScript = redis.NewScript(`
for i = 3, #ARGV, 2 do
	redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i+1])
end
redis.call('HSETNX', KEYS[1], 'since', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
`)

// AddUsage adds each owner's counts to its hash (P usage:{<owner>}), all
// owners in one pipeline of one script call per owner, each owner's
// counts whole or not at all. The owners' hashes may be on different
// nodes of a Redis Cluster. When Redis lost the script (a restart, SCRIPT
// FLUSH) it is loaded and the calls it failed run again, those alone. A
// call that fails may have added some owners' counts (a reply lost after
// Redis ran it, one cluster node failing): its retry counts them twice.
func (s *Store) AddUsage(ctx context.Context, add map[string]store.UsageCounts, now time.Time, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("AddUsage", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := store.CheckUsage(add); err != nil {
		return err
	}
	type call struct {
		key  string
		args []any
	}
	var calls []call
	since := strconv.FormatInt(now.UnixMilli(), 10)
	for owner, counts := range add {
		if !store.UsageWritten(counts) {
			continue
		}
		args := []any{ms(ttl), since}
		for name, n := range counts {
			if n != 0 {
				args = append(args, name, n)
			}
		}
		calls = append(calls, call{s.usageKey(owner), args})
	}
	for try := 0; len(calls) > 0; try++ {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(calls))
		for i, c := range calls {
			cmds[i] = addUsageScript.EvalSha(ctx, pipe, []string{c.key}, c.args...)
		}
		_, err := pipe.Exec(ctx)
		if err == nil {
			return nil
		}
		if try > 0 || !noScript(cmds) {
			return s.redisErr(ctx, "AddUsage", err)
		}
		var again []call
		for i, c := range cmds {
			if c.Err() != nil {
				if !isNoScript(c.Err()) {
					return s.redisErr(ctx, "AddUsage", c.Err())
				}
				again = append(again, calls[i])
			}
		}
		if err := addUsageScript.Load(ctx, s.rdb).Err(); err != nil {
			return s.redisErr(ctx, "AddUsage", err)
		}
		calls = again
	}
	return nil
}

// Usage returns owner's counts and when they began.
func (s *Store) Usage(ctx context.Context, owner string) (store.UsageCounts, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, opErr("Usage", err)
	}
	h, err := s.rdb.HGetAll(ctx, s.usageKey(owner)).Result()
	if err != nil {
		return nil, time.Time{}, s.redisErr(ctx, "Usage", err)
	}
	counts := make(store.UsageCounts, len(h))
	var since time.Time
	for name, v := range h {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, time.Time{}, opErr("Usage", err)
		}
		if name == store.UsageSince {
			since = time.UnixMilli(n)
			continue
		}
		counts[name] = n
	}
	return counts, since, nil
}

// usageKey holds owner's counters; the legacy owner's ("") is
// P usage:{}, a key like any other (an empty tag hashes the whole key).
func (s *Store) usageKey(owner string) string { return s.prefix + "usage:{" + owner + "}" }
