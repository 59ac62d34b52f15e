package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// An outbox item is stored as "<seq>|<deadline ms>|<item>". The Lua helper
// fields splits one into its sequence number, deadline and the offset of
// the item.
const outboxFields = `
local function fields(it)
	local a = string.find(it, '|', 1, true)
	local b = string.find(it, '|', a + 1, true)
	return tonumber(string.sub(it, 1, a - 1)), tonumber(string.sub(it, a + 1, b - 1)), b + 1
end
local function nowms(t)
	return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

// pushOutboxScript drops the passed items at the head, appends an item
// stamped with the device's next sequence number and its deadline, drops
// the oldest beyond max, and keeps the list and the counter as long as the
// longest-lived item. A missing counter starts from the server clock in µs
// and above the list's last item, so sequence numbers keep growing after
// the outbox was emptied (see the package comment).
// KEYS: outbox, seq. ARGV: item, max, ttl ms. Reply: the items dropped
// past max, those dropped expired, and the outbox's length after the push.
var pushOutboxScript = redis.NewScript(outboxFields + `
local t = redis.call('TIME')
local now = nowms(t)
local max, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local expired = 0
while true do
	local head = redis.call('LINDEX', KEYS[1], 0)
	if not head then
		break
	end
	local _, deadline = fields(head)
	if deadline > now then
		break
	end
	redis.call('LPOP', KEYS[1])
	expired = expired + 1
end
if max < 1 then
	local n = redis.call('LLEN', KEYS[1])
	redis.call('DEL', KEYS[1])
	return {n, expired, 0}
end
local seq
if redis.call('EXISTS', KEYS[2]) == 1 then
	seq = redis.call('INCR', KEYS[2])
else
	seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
	local last = redis.call('LINDEX', KEYS[1], -1)
	if last then
		local s = fields(last)
		if s >= seq then
			seq = s + 1
		end
	end
	redis.call('SET', KEYS[2], string.format('%.0f', seq))
end
local n = redis.call('RPUSH', KEYS[1], string.format('%.0f|%.0f|', seq, now + ttl) .. ARGV[1])
local full = 0
if n > max then
	full = n - max
	redis.call('LTRIM', KEYS[1], -max, -1)
end
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl then
		redis.call('PEXPIRE', k, ARGV[3])
	end
end
return {full, expired, n - full}
`)

// peekOutboxScript returns the live items after a sequence number, oldest
// first, as sequence number and item pairs.
// KEYS: outbox. ARGV: after.
var peekOutboxScript = redis.NewScript(outboxFields + `
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local now = nowms(redis.call('TIME'))
local after = tonumber(ARGV[1])
local out = {}
for _, it in ipairs(items) do
	local seq, deadline, at = fields(it)
	if seq > after and deadline > now then
		out[#out + 1] = string.format('%.0f', seq)
		out[#out + 1] = string.sub(it, at)
	end
end
return out
`)

// ackOutboxScript removes the items up to a sequence number (and the passed
// ones in front of them) if the owner record holds the reader's epoch.
// KEYS: outbox, owner. ARGV: epoch, upTo. Reply: 1 owner matched, 0 not,
// and the items removed unwritten because they expired.
var ackOutboxScript = redis.NewScript(outboxFields + `
local cur = redis.call('GET', KEYS[2])
if not cur or string.match(cur, '|(%d+)$') ~= ARGV[1] then
	return {0, 0}
end
local now = nowms(redis.call('TIME'))
local upTo = tonumber(ARGV[2])
local expired = 0
while true do
	local head = redis.call('LINDEX', KEYS[1], 0)
	if not head then
		break
	end
	local seq, deadline = fields(head)
	if seq > upTo and deadline > now then
		break
	end
	redis.call('LPOP', KEYS[1])
	if seq > upTo then
		expired = expired + 1
	end
end
return {1, expired}
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
	keys := []string{s.outboxKey(device), s.outboxSeqKey(device)}
	r, err := pushOutboxScript.Run(ctx, s.rdb, keys, item, max, ms(ttl)).Int64Slice()
	if err != nil {
		return s.redisErr(ctx, "PushOutbox", err)
	}
	if len(r) == 3 {
		s.metrics.OutboxPushed(r[2], r[0], r[1])
	}
	return nil
}

// PeekOutbox returns device's live items whose Seq is greater than after,
// oldest first, and leaves them in place.
func (s *Store) PeekOutbox(ctx context.Context, device string, after int64) ([]store.OutboxItem, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("PeekOutbox", err)
	}
	r, err := peekOutboxScript.Run(ctx, s.rdb, []string{s.outboxKey(device)}, after).Slice()
	if err != nil {
		return nil, s.redisErr(ctx, "PeekOutbox", err)
	}
	var out []store.OutboxItem
	for i := 0; i+1 < len(r); i += 2 {
		seq, err := replyBytes(r, i)
		if err != nil {
			return nil, opErr("PeekOutbox", err)
		}
		n, err := strconv.ParseInt(string(seq), 10, 64)
		if err != nil {
			return nil, opErr("PeekOutbox", err)
		}
		data, err := replyBytes(r, i+1)
		if err != nil {
			return nil, opErr("PeekOutbox", err)
		}
		out = append(out, store.OutboxItem{Seq: n, Data: data})
	}
	return out, nil
}

// AckOutbox removes device's items up to Seq upTo if device's owner record
// holds epoch, in one script: no claim can come between the check and the
// removal.
func (s *Store) AckOutbox(ctx context.Context, device string, epoch, upTo int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("AckOutbox", err)
	}
	keys := []string{s.outboxKey(device), s.ownerKey(device)}
	r, err := ackOutboxScript.Run(ctx, s.rdb, keys, epoch, upTo).Int64Slice()
	if err != nil {
		return false, s.redisErr(ctx, "AckOutbox", err)
	}
	if len(r) != 2 {
		return false, opErr("AckOutbox", fmt.Errorf("unexpected reply %v", r))
	}
	s.metrics.OutboxDropped(0, r[1])
	return r[0] == 1, nil
}

// outboxSeqKey holds the last sequence number handed out for d's outbox.
func (s *Store) outboxSeqKey(d string) string { return s.prefix + "outboxseq:{" + d + "}" }
