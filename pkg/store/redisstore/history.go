package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// A session's history is one list, oldest item first:
//
//	P history:{S}                         list    the items; PX the TTL of the last append

func (s *Store) historyKey(session string) string { return s.prefix + "history:{" + session + "}" }

// appendHistoryScript appends the items, keeps the newest that fit both
// bounds and renews the TTL.
// KEYS: history. ARGV: max items, max bytes, ttl ms, item…
var appendHistoryScript = redis.NewScript(`
local maxItems, maxBytes = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 4, #ARGV do
	redis.call('RPUSH', KEYS[1], ARGV[i])
end
if maxItems < 1 or maxBytes < 1 then
	redis.call('DEL', KEYS[1])
	return 0
end
redis.call('LTRIM', KEYS[1], -maxItems, -1)
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local total, keep = 0, 0
for i = #items, 1, -1 do
	total = total + #items[i]
	if total > maxBytes then
		break
	end
	keep = keep + 1
end
if keep == 0 then
	redis.call('DEL', KEYS[1])
	return 0
end
redis.call('LTRIM', KEYS[1], -keep, -1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 0
`)

// AppendHistory appends items to session's history and trims it, in one
// script; see store.History.
func (s *Store) AppendHistory(ctx context.Context, session string, items [][]byte, lim store.HistoryLimits) error {
	if err := ctx.Err(); err != nil {
		return opErr("AppendHistory", err)
	}
	if lim.TTL <= 0 {
		return errBadTTL
	}
	args := make([]any, 0, 3+len(items))
	args = append(args, lim.MaxItems, lim.MaxBytes, ms(lim.TTL))
	for _, it := range items {
		args = append(args, it)
	}
	if err := appendHistoryScript.Run(ctx, s.rdb, []string{s.historyKey(session)}, args...).Err(); err != nil {
		return s.redisErr(ctx, "AppendHistory", err)
	}
	return nil
}

// History returns session's items, oldest first.
func (s *Store) History(ctx context.Context, session string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("History", err)
	}
	r, err := s.rdb.LRange(ctx, s.historyKey(session), 0, -1).Result()
	if err != nil {
		return nil, s.redisErr(ctx, "History", err)
	}
	out := make([][]byte, len(r))
	for i, it := range r {
		out[i] = []byte(it)
	}
	return out, nil
}
