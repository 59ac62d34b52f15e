package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// AddUsage adds each owner's counts to its hash (P usage:{<owner>}), all
// owners in one pipeline: per owner a MULTI of an HINCRBY per counter, an
// HSETNX of since and a PEXPIRE, so an owner's counts are added whole or
// not at all. A reply lost after Redis ran it fails the call although
// the counts were added.
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
	written := false
	for _, counts := range add {
		written = written || store.UsageWritten(counts)
	}
	if !written {
		return nil
	}
	since := strconv.FormatInt(now.UnixMilli(), 10)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for owner, counts := range add {
			if !store.UsageWritten(counts) {
				continue
			}
			key := s.usageKey(owner)
			for name, n := range counts {
				if n != 0 {
					p.HIncrBy(ctx, key, name, n)
				}
			}
			p.HSetNX(ctx, key, store.UsageSince, since)
			p.PExpire(ctx, key, time.Duration(ms(ttl))*time.Millisecond)
		}
		return nil
	})
	if err != nil {
		return s.redisErr(ctx, "AddUsage", err)
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
