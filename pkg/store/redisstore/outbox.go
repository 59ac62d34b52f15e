package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// pushOutboxScript appends an item stamped with its deadline, drops the
// passed items at the head and the oldest beyond max, and keeps the list as
// long as its longest-lived item.
// KEYS: outbox. ARGV: item, max, ttl ms.
var pushOutboxScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
while true do
	local head = redis.call('LINDEX', KEYS[1], 0)
	if not head then
		break
	end
	local sep = string.find(head, '|', 1, true)
	if tonumber(string.sub(head, 1, sep - 1)) > now then
		break
	end
	redis.call('LPOP', KEYS[1])
end
if max < 1 then
	redis.call('DEL', KEYS[1])
	return 0
end
redis.call('RPUSH', KEYS[1], string.format('%.0f', now + ttl) .. '|' .. ARGV[1])
redis.call('LTRIM', KEYS[1], -max, -1)
if redis.call('PTTL', KEYS[1]) < ttl then
	redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
`)

// takeOutboxScript removes the outbox and returns its live items, oldest
// first.
// KEYS: outbox.
var takeOutboxScript = redis.NewScript(`
local items = redis.call('LRANGE', KEYS[1], 0, -1)
if #items == 0 then
	return {}
end
redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, it in ipairs(items) do
	local sep = string.find(it, '|', 1, true)
	if tonumber(string.sub(it, 1, sep - 1)) > now then
		out[#out + 1] = string.sub(it, sep + 1)
	end
end
return out
`)

// PushOutbox appends item to device's outbox. Each item is forgotten ttl after
// its push (by the Redis clock); the outbox keeps at most max items (none
// when max < 1), dropping the oldest.
func (s *Store) PushOutbox(ctx context.Context, device string, item []byte, max int, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("PushOutbox", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := pushOutboxScript.Run(ctx, s.rdb, []string{s.outboxKey(device)}, item, max, ms(ttl)).Err(); err != nil {
		return redisErr(ctx, "PushOutbox", err)
	}
	return nil
}

// TakeOutbox removes and returns device's live items, oldest first.
func (s *Store) TakeOutbox(ctx context.Context, device string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("TakeOutbox", err)
	}
	r, err := takeOutboxScript.Run(ctx, s.rdb, []string{s.outboxKey(device)}).Slice()
	if err != nil {
		return nil, redisErr(ctx, "TakeOutbox", err)
	}
	var out [][]byte
	for i := range r {
		b, err := replyBytes(r, i)
		if err != nil {
			return nil, opErr("TakeOutbox", err)
		}
		out = append(out, b)
	}
	return out, nil
}
