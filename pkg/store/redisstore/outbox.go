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

// accountOutboxScript keeps a shard's store-wide outbox accounting and
// picks what the bound drops: the oldest item of the device holding the
// most bytes within the share holding the most (store.OutboxLimits).
//
// Each item pushed with a bound is a member "<len>:<seq>:<device>" of
// :deadlines (by deadline) and :share (member -> its share), charged to
// its share in :shares (share -> bytes), to its device in :devices:<share>
// (device -> bytes of that share) and ordered in :order, whose members
// "<len(share)>:<share><len(D)>:<D><seq, 20 digits>:<len>" (all scored 0)
// sort each device's items of each share oldest first, so the oldest is
// one ZRANGEBYLEX away. :sum is the bytes of :deadlines.
//
// shim(v0.2.0): :due and :bytes, the accounting of the release before.
//
// :due and :bytes are the accounting of the release before (nearest
// deadline first, no holders): the items it counted are one holder of
// their own, dropped nearest deadline first when it holds the most, and
// leave it when acknowledged or past their deadline, as they did. It
// never grows: new items are counted above, so it is empty a day
// (MOBILE_OUTBOX_TTL) after an upgrade.
//
// The script forgets the members whose deadline passed and the members
// removed from their outboxes, counts a new one, and takes members out
// while the shard holds more than part bytes, returning them for their
// outboxes to drop. Before that, while the new member's share holds more
// than sharePart bytes of the shard, it takes out the share's own oldest
// (of its device holding the most). Whatever is found missing on the way
// (a holder with no item left, after keys expired at slightly different
// times) is forgotten, so the loops always end.
//
// KEYS: :due, :bytes, :deadlines, :sum, :shares, :order, :share (the
// shard's). ARGV: new member ("": none), its deadline ms, its length, part
// (0: none), ttl ms, its share, the prefix of the :devices:<share> keys,
// sharePart (0: none), then the members removed. Reply: none without a
// new member; else how many members the share's bound took out, then
// those, then the members the store-wide bound took out.
var accountOutboxScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = '(' .. string.format('%.0f', now)
local devPrefix = ARGV[7]
local function parse(m)
	local n, seq, dev = string.match(m, '^(%d+):(%d+):(.*)$')
	return tonumber(n), seq, dev
end
local function lp(s)
	return #s .. ':' .. s
end
local function order(share, dev, seq, n)
	return lp(share) .. lp(dev) .. string.rep('0', 20 - #seq) .. seq .. ':' .. n
end
local function count(key)
	return tonumber(redis.call('GET', key) or '0')
end
local legacy, sum = count(KEYS[2]), count(KEYS[4])
-- charge adds n bytes to dev within share (n < 0 takes them off).
local function charge(share, dev, n)
	local dk = devPrefix .. share
	if tonumber(redis.call('ZINCRBY', dk, n, dev)) <= 0 then
		redis.call('ZREM', dk, dev)
	end
	if tonumber(redis.call('ZINCRBY', KEYS[5], n, share)) <= 0 then
		redis.call('ZREM', KEYS[5], share)
	end
end
local function add(key, n)
	local v = redis.call('INCRBY', key, n)
	if v < 0 then
		redis.call('SET', key, 0)
		v = 0
	end
	return v
end
-- forget removes member m, known to be in :deadlines, charged to share.
local function forget(m, share)
	local n, seq, dev = parse(m)
	redis.call('ZREM', KEYS[3], m)
	redis.call('HDEL', KEYS[7], m)
	redis.call('ZREM', KEYS[6], order(share, dev, seq, n))
	charge(share, dev, -n)
	sum = add(KEYS[4], -n)
end
-- drop forgets m, which left its outbox, wherever it is counted.
local function drop(m)
	local share = redis.call('HGET', KEYS[7], m)
	if share then
		forget(m, share)
	elseif redis.call('ZREM', KEYS[3], m) == 1 then
		sum = add(KEYS[4], -parse(m))
	elseif redis.call('ZREM', KEYS[1], m) == 1 then
		legacy = add(KEYS[2], -parse(m))
	end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', past)) do
	drop(m)
end
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', past)
if #old > 0 then
	for _, m in ipairs(old) do
		legacy = add(KEYS[2], -parse(m))
	end
	redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', past)
end
for i = 9, #ARGV do
	drop(ARGV[i])
end
if ARGV[1] == '' then
	return {}
end
-- takeOldest takes the oldest item of the device that holds the most of
-- share sh out of the accounting into taken, or forgets what it finds
-- missing; false when sh has no device left.
local function takeOldest(sh, taken)
	local dk = devPrefix .. sh
	local d = redis.call('ZREVRANGE', dk, 0, 0)[1]
	if not d then
		redis.call('ZREM', KEYS[5], sh) -- a share with no device left
		return false
	end
	local p = lp(sh) .. lp(d)
	local o = redis.call('ZRANGEBYLEX', KEYS[6], '[' .. p, '(' .. p .. ';', 'LIMIT', 0, 1)[1]
	if not o then
		redis.call('ZREM', dk, d) -- a device with no item left
		return true
	end
	local oseq, on = string.match(string.sub(o, #p + 1), '^(%d+):(%d+)$')
	local m = on .. ':' .. string.gsub(oseq, '^0+', '') .. ':' .. d
	if redis.call('ZSCORE', KEYS[3], m) then
		forget(m, sh)
		taken[#taken + 1] = m
	else
		redis.call('ZREM', KEYS[6], o) -- an item no longer counted
		charge(sh, d, -tonumber(on))
	end
	return true
end
local share, size = ARGV[6], tonumber(ARGV[3])
local n, seq, dev = parse(ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[7], ARGV[1], share)
redis.call('ZADD', KEYS[6], 0, order(share, dev, seq, n))
charge(share, dev, size)
sum = add(KEYS[4], size)
-- The share's own bound first: its own oldest go, largest device first.
local byShare = {}
local sharePart = tonumber(ARGV[8])
while sharePart > 0 and tonumber(redis.call('ZSCORE', KEYS[5], share) or '0') > sharePart do
	if not takeOldest(share, byShare) then
		break
	end
end
local out = {}
local part = tonumber(ARGV[4])
while part > 0 and legacy + sum > part do
	local top = redis.call('ZREVRANGE', KEYS[5], 0, 0, 'WITHSCORES')
	local held = tonumber(top[2] or '0')
	if legacy > 0 and legacy >= held then
		local m = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
		if m then
			redis.call('ZREM', KEYS[1], m)
			legacy = add(KEYS[2], -parse(m))
			out[#out + 1] = m
		else
			redis.call('DEL', KEYS[2])
			legacy = 0
		end
	elseif not top[1] then
		redis.call('DEL', KEYS[4]) -- bytes no holder holds
		sum = 0
	else
		takeOldest(top[1], out)
	end
end
local ttl = tonumber(ARGV[5])
for i = 3, #KEYS do
	if redis.call('PTTL', KEYS[i]) < ttl + 1 then
		redis.call('PEXPIRE', KEYS[i], ttl + 1)
	end
end
local dk = devPrefix .. share
if redis.call('PTTL', dk) < ttl + 1 then
	redis.call('PEXPIRE', dk, ttl + 1)
end
local r = {tostring(#byShare)}
for _, m in ipairs(byShare) do
	r[#r + 1] = m
end
for _, m in ipairs(out) do
	r[#r + 1] = m
end
return r
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
// shard of the accounting (see Shards), which charges the item to lim.Share
// and device and names the items to drop past the share's part of the
// shard (lim.MaxShareBytes split as MaxStoreBytes is: the share's own
// oldest, of its device holding the most), then past the shard's part:
// the largest holder's oldest, of any device of the shard (see
// accountOutboxScript); each is then dropped by a script on its device's
// keys. A push that fails between the scripts leaves its item, or an item
// named to drop, in its outbox but out of the accounting (never dropped by
// the store-wide bound) until it is acknowledged or its deadline passes.
func (s *Store) PushOutbox(ctx context.Context, device string, item []byte, lim store.OutboxLimits) (store.OutboxDrops, error) {
	var d store.OutboxDrops
	if err := ctx.Err(); err != nil {
		return d, opErr("PushOutbox", err)
	}
	if lim.TTL <= 0 {
		return d, errBadTTL
	}
	var part, sharePart int64
	shards := int64(len(s.tags.outbox))
	if lim.MaxStoreBytes > 0 {
		part = (lim.MaxStoreBytes + shards - 1) / shards
	}
	if lim.MaxShareBytes > 0 {
		sharePart = (lim.MaxShareBytes + shards - 1) / shards
	}
	// An item longer than its share's part is not kept, as the script
	// would keep it (in the order the script checks the other bounds).
	if size := int64(len(item)); lim.MaxItems >= 1 && (lim.MaxBytes <= 0 || len(item) <= lim.MaxBytes) &&
		(part == 0 || size <= part) && sharePart > 0 && size > sharePart {
		d.Share = 1
		s.countOutboxDrops(d)
		return d, nil
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
	if (part > 0 || sharePart > 0) && (member != "" || len(gone) > 0) {
		sh := s.tags.outbox.of(device)
		args := append([]any{member, deadline, len(item), part, ms(lim.TTL), lim.Share, s.outboxDevicesPrefix(sh), sharePart}, gone...)
		taken, err := accountOutboxScript.Run(ctx, s.rdb, s.outboxPoolKeys(sh), args...).StringSlice()
		if err != nil {
			s.countOutboxDrops(d)
			return d, s.redisErr(ctx, "PushOutbox", err)
		}
		byShare := 0
		if len(taken) > 0 {
			if byShare, err = strconv.Atoi(taken[0]); err != nil || byShare > len(taken)-1 {
				return d, opErr("PushOutbox", fmt.Errorf("malformed accounting reply %q", taken[0]))
			}
			taken = taken[1:]
		}
		for i, m := range taken {
			evicted, err := s.evictOutbox(ctx, m)
			if err != nil {
				s.countOutboxDrops(d)
				return d, err
			}
			switch {
			case !evicted:
			case i < byShare:
				d.Share++
			default:
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
	s.metrics.OutboxDropped(telemetry.OutboxShare, int64(d.Share))
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
	sh := s.tags.outbox.of(device)
	if len(r) > 2 {
		args := []any{"", 0, 0, 0, 0, "", s.outboxDevicesPrefix(sh), 0}
		for i := 2; i < len(r); i++ {
			g, err := replyBytes(r, i)
			if err != nil {
				return ok == 1, opErr("AckOutbox", err)
			}
			args = append(args, string(g)+":"+device)
		}
		if err := accountOutboxScript.Run(ctx, s.rdb, s.outboxPoolKeys(sh), args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
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

// outboxPoolKeys are the KEYS of accountOutboxScript: a shard's
// store-wide outbox accounting (see there). The first two are the release
// before's.
func (s *Store) outboxPoolKeys(shard int) []string {
	t := s.prefix + s.tags.outbox[shard]
	return []string{t + ":due", t + ":bytes", t + ":deadlines", t + ":sum", t + ":shares", t + ":order", t + ":share"}
}

// outboxDevicesPrefix starts the keys of a shard's devices by the bytes
// they hold in one share: the prefix and the share's name.
func (s *Store) outboxDevicesPrefix(shard int) string {
	return s.prefix + s.tags.outbox[shard] + ":devices:"
}
