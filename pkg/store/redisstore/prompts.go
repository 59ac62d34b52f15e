package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// putPromptScript stores a card and schedules its expiry.
// KEYS: card, due zset. ARGV: id, device, expires µs, record JSON, key ttl ms.
var putPromptScript = redis.NewScript(`
redis.call('HSET', KEYS[1], 'device', ARGV[2], 'expires', ARGV[3], 'rec', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[5]) then
	redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return 0
`)

// takePromptScript removes a live card for its device.
// KEYS: card, due zset. ARGV: id, device, now µs.
// Reply: {0} not found or expired, {1} another device's, {2, record JSON}.
var takePromptScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'device', 'expires', 'rec')
if not v[3] or tonumber(v[2]) <= tonumber(ARGV[3]) then
	return {0}
end
if v[1] ~= ARGV[2] then
	return {1}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return {2, v[3]}
`)

// takeExpiredScript removes and returns up to max cards due at now, earliest
// first. A due id whose card is gone (kept past PromptGrace) is dropped.
// KEYS: due zset. ARGV: now µs, max, card key prefix.
var takeExpiredScript = redis.NewScript(`
local want = tonumber(ARGV[2])
local out = {}
while #out < want do
	local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, want - #out)
	if #ids == 0 then
		break
	end
	for _, id in ipairs(ids) do
		local card = ARGV[3] .. id
		local rec = redis.call('HGET', card, 'rec')
		redis.call('DEL', card)
		redis.call('ZREM', KEYS[1], id)
		if rec then
			out[#out + 1] = rec
		end
	end
end
return out
`)

// PutPrompt stores p until p.Expires, replacing a card with the same id. The
// card is kept Options.PromptGrace longer for TakeExpired.
func (s *Store) PutPrompt(ctx context.Context, p store.PromptRecord) error {
	if err := ctx.Err(); err != nil {
		return opErr("PutPrompt", err)
	}
	rec, err := json.Marshal(p)
	if err != nil {
		return opErr("PutPrompt", err)
	}
	ttl := max(time.Until(p.Expires), 0) + s.promptGrace
	sh := s.tags.prompts.of(p.ID)
	err = putPromptScript.Run(ctx, s.rdb, []string{s.cardKeyPrefix(sh) + p.ID, s.dueKey(sh)},
		p.ID, p.Device, micros(p.Expires), rec, ms(ttl)).Err()
	if err != nil {
		return s.redisErr(ctx, "PutPrompt", err)
	}
	return nil
}

// TakePrompt removes and returns card id if device owns it. An expired card
// is store.ErrNotFound and stays for TakeExpired, so that its expiry is still
// reported.
func (s *Store) TakePrompt(ctx context.Context, id, device string) (store.PromptRecord, error) {
	if err := ctx.Err(); err != nil {
		return store.PromptRecord{}, opErr("TakePrompt", err)
	}
	sh := s.tags.prompts.of(id)
	r, err := takePromptScript.Run(ctx, s.rdb, []string{s.cardKeyPrefix(sh) + id, s.dueKey(sh)},
		id, device, micros(s.clock.Now())).Slice()
	if err != nil {
		return store.PromptRecord{}, s.redisErr(ctx, "TakePrompt", err)
	}
	code, err := replyInt(r, 0)
	if err != nil {
		return store.PromptRecord{}, opErr("TakePrompt", err)
	}
	switch code {
	case 0:
		return store.PromptRecord{}, store.ErrNotFound
	case 1:
		return store.PromptRecord{}, store.ErrForbidden
	}
	b, err := replyBytes(r, 1)
	if err != nil {
		return store.PromptRecord{}, opErr("TakePrompt", err)
	}
	return decodePrompt(b)
}

// TakeExpired removes and returns up to max cards whose Expires is not after
// now, earliest first. A card whose record does not decode (written by
// something else than a Store) is dropped.
func (s *Store) TakeExpired(ctx context.Context, now time.Time, max int) ([]store.PromptRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("TakeExpired", err)
	}
	if max < 1 {
		return nil, nil
	}
	at := micros(now)
	due, err := s.dueIndexes(ctx, shardKeys(len(s.tags.prompts), s.dueKey), at)
	if err != nil {
		return nil, s.redisErr(ctx, "TakeExpired", err)
	}
	var out []store.PromptRecord
	for _, sh := range due {
		r, err := takeExpiredScript.Run(ctx, s.rdb, []string{s.dueKey(sh)}, at, max-len(out), s.cardKeyPrefix(sh)).Slice()
		if err != nil {
			return out, s.redisErr(ctx, "TakeExpired", err)
		}
		for i := range r {
			b, err := replyBytes(r, i)
			if err != nil {
				continue
			}
			if rec, err := decodePrompt(b); err == nil {
				out = append(out, rec)
			}
		}
		if len(out) >= max {
			break
		}
	}
	return out, nil
}

func decodePrompt(b []byte) (store.PromptRecord, error) {
	var rec store.PromptRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return store.PromptRecord{}, fmt.Errorf("redisstore: prompt record: %w", err)
	}
	return rec, nil
}

// micros formats t as Unix microseconds, the score of a card: exact in a
// float64 (a zset score) for every date the gateway will see.
func micros(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }
