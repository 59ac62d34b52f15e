package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
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
// stamped with the device's next sequence number and its deadline, and
// drops the oldest past max items and past maxBytes bytes; it keeps the
// list, the counter and the byte count as long as the longest-lived item.
// An item longer than maxBytes, or than part (the store-wide bound's part
// of the device's shard), is not kept. A missing counter starts from the
// server clock in µs and above the list's last item, so sequence numbers
// keep growing after the outbox was emptied (see the package comment).
// KEYS: outbox, seq, bytes. ARGV: item, max, ttl ms, maxBytes (0: none),
// part (0: none). Reply: seq (0: not kept), deadline ms, then the items
// dropped full, past maxBytes, past part, expired, the outbox's length
// after the push, and "<len>:<seq>" of each item removed.
var pushOutboxScript = redis.NewScript(outboxFields + `
local t = redis.call('TIME')
local now = nowms(t)
local max, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local maxBytes, part = tonumber(ARGV[4]), tonumber(ARGV[5])
local size = #ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then
	redis.call('DEL', KEYS[3])
end
local gone = {}
local bytes = tonumber(redis.call('GET', KEYS[3]) or '0')
local function pop()
	local it = redis.call('LPOP', KEYS[1])
	local seq, _, at = fields(it)
	local n = #it - at + 1
	bytes = redis.call('DECRBY', KEYS[3], n)
	gone[#gone + 1] = string.format('%d:%.0f', n, seq)
end
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
	pop()
	expired = expired + 1
end
local function reply(seq, full, over, store, n)
	local r = {seq, now + ttl, full, over, store, expired, n}
	for _, g in ipairs(gone) do
		r[#r + 1] = g
	end
	return r
end
if max < 1 then
	local n = 0
	while redis.call('LLEN', KEYS[1]) > 0 do
		pop()
		n = n + 1
	end
	redis.call('DEL', KEYS[1], KEYS[3])
	return reply(0, n, 0, 0, 0)
end
if maxBytes > 0 and size > maxBytes then
	return reply(0, 0, 1, 0, redis.call('LLEN', KEYS[1]))
end
if part > 0 and size > part then
	return reply(0, 0, 0, 1, redis.call('LLEN', KEYS[1]))
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
bytes = redis.call('INCRBY', KEYS[3], size)
local full, over = 0, 0
while n > max do
	pop()
	full = full + 1
	n = n - 1
end
while maxBytes > 0 and bytes > maxBytes do
	pop()
	over = over + 1
	n = n - 1
end
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl then
		redis.call('PEXPIRE', k, ARGV[3])
	end
end
return reply(string.format('%.0f', seq), full, over, 0, n)
`)

// accountOutboxScript keeps a shard's store-wide outbox accounting: it
// forgets the members whose deadline passed and the members removed from
// their outboxes, counts a new one, and takes out the members nearest
// their deadline while the shard holds more than part bytes, returning
// them for their outboxes to drop. A member is "<len>:<seq>:<device>".
// KEYS: {outbox:i}:due, {outbox:i}:bytes. ARGV: new member ("": none),
// its deadline ms, its length, part (0: none), ttl ms, then the members
// removed. Reply: the members taken out.
var accountOutboxScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = '(' .. string.format('%.0f', now)
local function size(m)
	return tonumber(string.match(m, '^(%d+):'))
end
local freed = 0
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', past)
for _, m in ipairs(old) do
	freed = freed + size(m)
end
if #old > 0 then
	redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', past)
end
for i = 6, #ARGV do
	if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
		freed = freed + size(ARGV[i])
	end
end
if freed > 0 then
	redis.call('DECRBY', KEYS[2], freed)
end
local out = {}
if ARGV[1] == '' then
	return out
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local total = redis.call('INCRBY', KEYS[2], ARGV[3])
local part = tonumber(ARGV[4])
while part > 0 and total > part do
	local m = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
	redis.call('ZREM', KEYS[1], m)
	total = redis.call('DECRBY', KEYS[2], size(m))
	out[#out + 1] = m
end
local ttl = tonumber(ARGV[5])
for _, k in ipairs(KEYS) do
	if redis.call('PTTL', k) < ttl + 1 then
		redis.call('PEXPIRE', k, ttl + 1)
	end
end
return out
`)

// evictOutboxScript removes one item, named by its sequence number, from
// an outbox: the store-wide bound took it out of the accounting.
// KEYS: outbox, bytes. ARGV: seq. Reply: 1 removed, 0 not there.
var evictOutboxScript = redis.NewScript(outboxFields + `
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local want = tonumber(ARGV[1])
for _, it in ipairs(items) do
	local seq, _, at = fields(it)
	if seq == want then
		redis.call('LREM', KEYS[1], 1, it)
		if redis.call('EXISTS', KEYS[1]) == 1 then
			redis.call('DECRBY', KEYS[2], #it - at + 1)
		else
			redis.call('DEL', KEYS[2])
		end
		return 1
	end
end
return 0
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
// KEYS: outbox, owner, bytes. ARGV: epoch, upTo. Reply: 1 owner matched, 0
// not, the items removed unwritten because they expired, and "<len>:<seq>"
// of each item removed.
var ackOutboxScript = redis.NewScript(outboxFields + `
local cur = redis.call('GET', KEYS[2])
if not cur or string.match(cur, '|(%d+)$') ~= ARGV[1] then
	return {0, 0}
end
local now = nowms(redis.call('TIME'))
local upTo = tonumber(ARGV[2])
local r = {1, 0}
local freed = 0
while true do
	local head = redis.call('LINDEX', KEYS[1], 0)
	if not head then
		break
	end
	local seq, deadline, at = fields(head)
	if seq > upTo and deadline > now then
		break
	end
	redis.call('LPOP', KEYS[1])
	if seq > upTo then
		r[2] = r[2] + 1
	end
	local n = #head - at + 1
	freed = freed + n
	r[#r + 1] = string.format('%d:%.0f', n, seq)
end
if redis.call('EXISTS', KEYS[1]) == 0 then
	redis.call('DEL', KEYS[3])
elseif freed > 0 then
	redis.call('DECRBY', KEYS[3], freed)
end
return r
`)

// PushOutbox appends item to device's outbox for lim.TTL (by the Redis
// clock) and drops the oldest items past lim's bounds: the device's in one
// script on the device's keys, then the store's in a script on the device's
// shard of the accounting (see Shards), which names the items of any
// device of that shard to drop. A push that fails between the two leaves
// its item out of the accounting until its deadline.
func (s *Store) PushOutbox(ctx context.Context, device string, item []byte, lim store.OutboxLimits) (store.OutboxDrops, error) {
	var d store.OutboxDrops
	if err := ctx.Err(); err != nil {
		return d, opErr("PushOutbox", err)
	}
	if lim.TTL <= 0 {
		return d, errBadTTL
	}
	var part int64
	if lim.MaxStoreBytes > 0 {
		n := int64(len(s.tags.outbox))
		part = (lim.MaxStoreBytes + n - 1) / n
	}
	keys := []string{s.outboxKey(device), s.outboxSeqKey(device), s.outboxBytesKey(device)}
	r, err := pushOutboxScript.Run(ctx, s.rdb, keys, item, lim.MaxItems, ms(lim.TTL), max(lim.MaxBytes, 0), part).Slice()
	if err != nil {
		return d, s.redisErr(ctx, "PushOutbox", err)
	}
	var n [7]int64
	for i := range n {
		if i == 0 {
			seq, err := replyBytes(r, 0) // a string: a seq is past float64's integers in Lua's integer replies
			if err != nil {
				n[0], err = replyInt(r, 0)
			} else {
				n[0], err = strconv.ParseInt(string(seq), 10, 64)
			}
			if err != nil {
				return d, opErr("PushOutbox", err)
			}
			continue
		}
		if n[i], err = replyInt(r, i); err != nil {
			return d, opErr("PushOutbox", err)
		}
	}
	seq, deadline := n[0], n[1]
	d = store.OutboxDrops{Full: int(n[2]), Bytes: int(n[3]), Store: int(n[4]), Expired: int(n[5])}
	if seq != 0 {
		s.metrics.OutboxPushed(n[6])
	}
	gone := make([]any, 0, len(r)-7)
	for i := 7; i < len(r); i++ {
		g, err := replyBytes(r, i)
		if err != nil {
			return d, opErr("PushOutbox", err)
		}
		gone = append(gone, string(g)+":"+device)
	}
	member := ""
	if seq != 0 {
		member = strconv.Itoa(len(item)) + ":" + strconv.FormatInt(seq, 10) + ":" + device
	}
	// Without a store-wide bound nothing is counted: such pushes (tests')
	// may share a prefix with a bounded store without being dropped by it.
	if part > 0 && (member != "" || len(gone) > 0) {
		sh := s.tags.outbox.of(device)
		args := append([]any{member, deadline, len(item), part, ms(lim.TTL)}, gone...)
		taken, err := accountOutboxScript.Run(ctx, s.rdb, []string{s.outboxDueKey(sh), s.outboxBytesSumKey(sh)}, args...).StringSlice()
		if err != nil {
			s.countOutboxDrops(d)
			return d, s.redisErr(ctx, "PushOutbox", err)
		}
		for _, m := range taken {
			evicted, err := s.evictOutbox(ctx, m)
			if err != nil {
				s.countOutboxDrops(d)
				return d, err
			}
			if evicted {
				d.Store++
			}
		}
	}
	s.countOutboxDrops(d)
	return d, nil
}

// evictOutbox drops the item an accounting member names from its outbox.
func (s *Store) evictOutbox(ctx context.Context, member string) (bool, error) {
	parts := strings.SplitN(member, ":", 3)
	if len(parts) != 3 {
		return false, opErr("PushOutbox", fmt.Errorf("malformed outbox member %q", member))
	}
	dev := parts[2]
	n, err := evictOutboxScript.Run(ctx, s.rdb, []string{s.outboxKey(dev), s.outboxBytesKey(dev)}, parts[1]).Int64()
	if err != nil {
		return false, s.redisErr(ctx, "PushOutbox", err)
	}
	return n == 1, nil
}

func (s *Store) countOutboxDrops(d store.OutboxDrops) {
	s.metrics.OutboxDropped(telemetry.OutboxFull, int64(d.Full))
	s.metrics.OutboxDropped(telemetry.OutboxBytes, int64(d.Bytes))
	s.metrics.OutboxDropped(telemetry.OutboxStore, int64(d.Store))
	s.metrics.OutboxDropped(telemetry.OutboxExpired, int64(d.Expired))
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
// removal. The store-wide accounting forgets them in a second script.
func (s *Store) AckOutbox(ctx context.Context, device string, epoch, upTo int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, opErr("AckOutbox", err)
	}
	keys := []string{s.outboxKey(device), s.ownerKey(device), s.outboxBytesKey(device)}
	r, err := ackOutboxScript.Run(ctx, s.rdb, keys, epoch, upTo).Slice()
	if err != nil {
		return false, s.redisErr(ctx, "AckOutbox", err)
	}
	ok, err1 := replyInt(r, 0)
	expired, err2 := replyInt(r, 1)
	if err := errors.Join(err1, err2); err != nil {
		return false, opErr("AckOutbox", err)
	}
	s.metrics.OutboxDropped(telemetry.OutboxExpired, expired)
	if len(r) > 2 {
		args := []any{"", 0, 0, 0, 0}
		for i := 2; i < len(r); i++ {
			g, err := replyBytes(r, i)
			if err != nil {
				return ok == 1, opErr("AckOutbox", err)
			}
			args = append(args, string(g)+":"+device)
		}
		sh := s.tags.outbox.of(device)
		if err := accountOutboxScript.Run(ctx, s.rdb, []string{s.outboxDueKey(sh), s.outboxBytesSumKey(sh)}, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
			// The items are gone from the outbox; the accounting forgets them by their deadline.
			return ok == 1, s.redisErr(ctx, "AckOutbox", err)
		}
	}
	return ok == 1, nil
}

// outboxSeqKey holds the last sequence number handed out for d's outbox.
func (s *Store) outboxSeqKey(d string) string { return s.prefix + "outboxseq:{" + d + "}" }

// outboxBytesKey holds the bytes of d's outbox items.
func (s *Store) outboxBytesKey(d string) string { return s.prefix + "outboxbytes:{" + d + "}" }

// outboxDueKey is a shard's store-wide outbox accounting: "<len>:<seq>:<D>"
// scored by deadline.
func (s *Store) outboxDueKey(shard int) string { return s.prefix + s.tags.outbox[shard] + ":due" }

// outboxBytesSumKey is the bytes of the items in a shard's outboxDueKey.
func (s *Store) outboxBytesSumKey(shard int) string {
	return s.prefix + s.tags.outbox[shard] + ":bytes"
}
