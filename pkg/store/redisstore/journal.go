package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// A device's journal keys share the hash tag T of its shard (see Shards:
// {journals} on a single server), so the shard's index and every journal in
// it can be changed by one script. Lease deadlines are Redis TIME in ms; a
// lease is held while its "until" is in the future.
//
//	P T:log:<D>   list  "<seq>|<entry>", oldest first; PX the TTL of its last append
//	P T:meta:<D>  hash  "seq" (the last Seq), "owner", "until", "takeovers" (of the head); PX as the log
//	P T:due       zset  D scored by its lease deadline (0: free, with entries); PX its longest journal's

// journalNow is the Redis clock in ms, the first lines of every journal
// script.
const journalNow = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// journalLease gives the lease of the journal whose meta is KEYS[2] to
// owner until now + lease ms and indexes device in KEYS[3]; the meta
// lives as long as the log (KEYS[1]), so the journal is forgotten whole.
// held reports whether owner holds the lease, whether it is free, and
// whether it is free because its deadline passed (not released).
const journalLease = `
local function lease(owner, ms, device)
	local untl = now + tonumber(ms)
	redis.call('HSET', KEYS[2], 'owner', owner, 'until', untl)
	local ttl = redis.call('PTTL', KEYS[1])
	redis.call('PEXPIRE', KEYS[2], ttl > 0 and ttl or ms)
	redis.call('ZADD', KEYS[3], untl, device)
end
local function held(owner)
	local m = redis.call('HMGET', KEYS[2], 'owner', 'until')
	local released = m[1] == false or m[1] == ''
	local lapsed = not released and tonumber(m[2]) <= now
	return m[1] == owner and tonumber(m[2]) > now, released or lapsed, lapsed
end
`

// appendJournalScript appends an entry unless the log is full and takes a
// free lease, counting a takeover of the head if the lease had expired.
// Seqs grow across the journal's lives (see the comment in the script).
// KEYS: log, meta, due. ARGV: entry, max, owner, lease ms, ttl ms, device.
// Reply: {appended 0|1, held 0|1}, and when it took the lease also the
// head's seq, entry and takeovers.
var appendJournalScript = redis.NewScript(journalNow + journalLease + `
local mine, free, lapsed = held(ARGV[3])
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then
	return {0, mine and 1 or 0}
end
local seq = redis.call('HGET', KEYS[2], 'seq')
if seq then
	seq = string.format('%.0f', redis.call('HINCRBY', KEYS[2], 'seq', 1))
else
	-- A journal's first Seq is the Redis clock in µs, and above its last
	-- entry if one is left: a Seq a router remembers from before the
	-- journal was forgotten (a Redis restart) never names a new entry.
	local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
	local last = redis.call('LINDEX', KEYS[1], -1)
	if last then
		local s = tonumber(string.sub(last, 1, string.find(last, '|', 1, true) - 1))
		if s >= n then
			n = s + 1
		end
	end
	seq = string.format('%.0f', n) -- %.0f: Lua prints µs as %.14g
	redis.call('HSET', KEYS[2], 'seq', seq)
end
redis.call('RPUSH', KEYS[1], seq .. '|' .. ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if free then
	if lapsed then
		redis.call('HINCRBY', KEYS[2], 'takeovers', 1)
	end
	lease(ARGV[3], ARGV[4], ARGV[6])
end
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) then
	redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
if not free then
	return {1, mine and 1 or 0}
end
local head = redis.call('LINDEX', KEYS[1], 0)
local sep = string.find(head, '|', 1, true)
local takeovers = tonumber(redis.call('HGET', KEYS[2], 'takeovers')) or 0
return {1, 1, tonumber(string.sub(head, 1, sep - 1)), string.sub(head, sep + 1), takeovers}
`)

// nextJournalScript removes the done entry if it is the head (and with it
// the head's takeover count) and returns the head, extending the lease, or
// releases the lease of an empty log.
// KEYS: log, meta, due. ARGV: owner, done seq, lease ms, device.
// Reply: {0} not held, {1} empty and released, {2, seq, entry, takeovers}.
var nextJournalScript = redis.NewScript(journalNow + journalLease + `
if not held(ARGV[1]) then
	return {0}
end
local head = redis.call('LINDEX', KEYS[1], 0)
if head and ARGV[2] ~= '0' then
	local sep = string.find(head, '|', 1, true)
	if string.sub(head, 1, sep - 1) == ARGV[2] then
		redis.call('LPOP', KEYS[1])
		redis.call('HDEL', KEYS[2], 'takeovers')
		head = redis.call('LINDEX', KEYS[1], 0)
	end
end
if not head then
	redis.call('HDEL', KEYS[2], 'owner', 'until', 'takeovers')
	redis.call('ZREM', KEYS[3], ARGV[4])
	return {1}
end
lease(ARGV[1], ARGV[3], ARGV[4])
local sep = string.find(head, '|', 1, true)
local takeovers = tonumber(redis.call('HGET', KEYS[2], 'takeovers')) or 0
return {2, tonumber(string.sub(head, 1, sep - 1)), string.sub(head, sep + 1), takeovers}
`)

// renewJournalScript extends a held lease.
// KEYS: log, meta, due. ARGV: owner, lease ms, device. Reply: 1 held, 0 not.
var renewJournalScript = redis.NewScript(journalNow + journalLease + `
if not held(ARGV[1]) then
	return 0
end
lease(ARGV[1], ARGV[2], ARGV[3])
return 1
`)

// releaseJournalScript frees a held lease; a log with entries stays in the
// index with score 0, due at once.
// KEYS: log, meta, due. ARGV: owner, device.
var releaseJournalScript = redis.NewScript(journalNow + journalLease + `
if held(ARGV[1]) then
	redis.call('HDEL', KEYS[2], 'owner', 'until')
	if redis.call('LLEN', KEYS[1]) > 0 then
		redis.call('ZADD', KEYS[3], 0, ARGV[2])
	else
		redis.call('ZREM', KEYS[3], ARGV[2])
	end
end
return 0
`)

// takeJournalsScript leases up to max journals that are due (lease free)
// and hold entries, counting a takeover of the head of each whose lease
// had expired (rather than been released). A due device whose lease is in fact held gets its
// deadline back; one whose log is gone leaves the index.
// KEYS: due. ARGV: owner, lease ms, max, log key prefix, meta key prefix.
var takeJournalsScript = redis.NewScript(journalNow + `
local want = tonumber(ARGV[3])
local untl = now + tonumber(ARGV[2])
local out = {}
while #out < want do
	local devs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, want - #out)
	if #devs == 0 then
		break
	end
	for _, d in ipairs(devs) do
		local log, meta = ARGV[4] .. d, ARGV[5] .. d
		local m = redis.call('HMGET', meta, 'owner', 'until')
		if m[1] and m[1] ~= '' and tonumber(m[2]) > now then
			redis.call('ZADD', KEYS[1], m[2], d)
		elseif redis.call('LLEN', log) == 0 then
			redis.call('ZREM', KEYS[1], d)
		else
			if m[1] and m[1] ~= '' then
				redis.call('HINCRBY', meta, 'takeovers', 1)
			end
			redis.call('HSET', meta, 'owner', ARGV[1], 'until', untl)
			redis.call('PEXPIRE', meta, redis.call('PTTL', log))
			redis.call('ZADD', KEYS[1], untl, d)
			out[#out + 1] = d
		end
	end
end
return out
`)

func (s *Store) journalLogPrefix(shard int) string {
	return s.prefix + s.tags.journals[shard] + ":log:"
}
func (s *Store) journalMetaPrefix(shard int) string {
	return s.prefix + s.tags.journals[shard] + ":meta:"
}
func (s *Store) journalDueKey(shard int) string {
	return s.prefix + s.tags.journals[shard] + ":due"
}

// journalKeys are the KEYS of the per-device journal scripts.
func (s *Store) journalKeys(device string) []string {
	sh := s.tags.journals.of(device)
	return []string{s.journalLogPrefix(sh) + device, s.journalMetaPrefix(sh) + device, s.journalDueKey(sh)}
}

// AppendJournal implements store.Journal.
func (s *Store) AppendJournal(ctx context.Context, device, owner string, data []byte, lim store.JournalLimits) (store.Appended, error) {
	if err := ctx.Err(); err != nil {
		return store.Appended{}, opErr("AppendJournal", err)
	}
	if lim.Lease <= 0 || lim.TTL <= 0 {
		return store.Appended{}, errBadTTL
	}
	r, err := appendJournalScript.Run(ctx, s.rdb, s.journalKeys(device),
		data, lim.MaxLen, owner, ms(lim.Lease), ms(lim.TTL), device).Slice()
	if err != nil {
		return store.Appended{}, s.redisErr(ctx, "AppendJournal", err)
	}
	appended, err := replyInt(r, 0)
	if err != nil {
		return store.Appended{}, opErr("AppendJournal", err)
	}
	mine, err := replyInt(r, 1)
	if err != nil {
		return store.Appended{}, opErr("AppendJournal", err)
	}
	a := store.Appended{Leased: mine == 1}
	if appended == 0 {
		return a, store.ErrJournalFull
	}
	if len(r) > 2 {
		if a.Head, err = journalEntry(r[2:]); err != nil {
			return store.Appended{}, opErr("AppendJournal", err)
		}
	}
	return a, nil
}

// journalEntry reads a script's {seq, entry, takeovers}.
func journalEntry(r []any) (*store.JournalEntry, error) {
	seq, err := replyInt(r, 0)
	if err != nil {
		return nil, err
	}
	data, err := replyBytes(r, 1)
	if err != nil {
		return nil, err
	}
	takeovers, err := replyInt(r, 2)
	if err != nil {
		return nil, err
	}
	return &store.JournalEntry{Seq: seq, Data: data, Takeovers: int(takeovers)}, nil
}

// NextJournal implements store.Journal.
func (s *Store) NextJournal(ctx context.Context, device, owner string, done int64, lease time.Duration) (store.JournalEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.JournalEntry{}, false, opErr("NextJournal", err)
	}
	if lease <= 0 {
		return store.JournalEntry{}, false, errBadTTL
	}
	r, err := nextJournalScript.Run(ctx, s.rdb, s.journalKeys(device),
		owner, strconv.FormatInt(done, 10), ms(lease), device).Slice()
	if err != nil {
		return store.JournalEntry{}, false, s.redisErr(ctx, "NextJournal", err)
	}
	code, err := replyInt(r, 0)
	if err != nil {
		return store.JournalEntry{}, false, opErr("NextJournal", err)
	}
	switch code {
	case 0:
		return store.JournalEntry{}, false, store.ErrLeaseLost
	case 1:
		return store.JournalEntry{}, false, nil
	}
	e, err := journalEntry(r[1:])
	if err != nil {
		return store.JournalEntry{}, false, opErr("NextJournal", err)
	}
	return *e, true, nil
}

// RenewJournal implements store.Journal.
func (s *Store) RenewJournal(ctx context.Context, device, owner string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("RenewJournal", err)
	}
	if lease <= 0 {
		return errBadTTL
	}
	n, err := renewJournalScript.Run(ctx, s.rdb, s.journalKeys(device), owner, ms(lease), device).Int()
	if err != nil {
		return s.redisErr(ctx, "RenewJournal", err)
	}
	if n == 0 {
		return store.ErrLeaseLost
	}
	return nil
}

// ReleaseJournal implements store.Journal.
func (s *Store) ReleaseJournal(ctx context.Context, device, owner string) error {
	if err := ctx.Err(); err != nil {
		return opErr("ReleaseJournal", err)
	}
	if err := releaseJournalScript.Run(ctx, s.rdb, s.journalKeys(device), owner, device).Err(); err != nil {
		return s.redisErr(ctx, "ReleaseJournal", err)
	}
	return nil
}

// TakeJournals implements store.Journal. With shards it looks at every
// shard's index in one pipelined round trip and then runs the taking script
// on the shards that have a due lease, one after another, until max are
// taken; an idle sweep costs one round trip. The look uses this host's clock against the
// Redis clock of the deadlines, so a clock behind Redis's sees a lapsed
// lease that much later (a released one, scored 0, at once).
func (s *Store) TakeJournals(ctx context.Context, owner string, lease time.Duration, max int) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("TakeJournals", err)
	}
	if lease <= 0 {
		return nil, errBadTTL
	}
	if max < 1 {
		return nil, nil
	}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	due, err := s.dueIndexes(ctx, shardKeys(len(s.tags.journals), s.journalDueKey), now)
	if err != nil {
		return nil, s.redisErr(ctx, "TakeJournals", err)
	}
	var out []string
	for _, sh := range due {
		r, err := takeJournalsScript.Run(ctx, s.rdb, []string{s.journalDueKey(sh)},
			owner, ms(lease), max-len(out), s.journalLogPrefix(sh), s.journalMetaPrefix(sh)).StringSlice()
		if err != nil {
			return out, s.redisErr(ctx, "TakeJournals", err)
		}
		out = append(out, r...)
		if len(out) >= max {
			break
		}
	}
	return out, nil
}

// dueIndexes returns the positions in keys of the zsets that have a member
// scored up to max, looked at in one pipelined round trip. The order starts
// at a position that turns with every call, so that a max smaller than what
// is due does not always favour the first keys.
func (s *Store) dueIndexes(ctx context.Context, keys []string, max string) ([]int, error) {
	if len(keys) == 1 {
		return []int{0}, nil // the script itself looks: no round trip more
	}
	counts := make([]*redis.IntCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			counts[i] = p.ZCount(ctx, k, "-inf", max)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	start := int(s.turn.Add(1) % uint64(len(keys)))
	var due []int
	for i := range keys {
		j := (start + i) % len(keys)
		if counts[j].Val() > 0 {
			due = append(due, j)
		}
	}
	return due, nil
}

// shardKeys is key(shard) for each of n shards.
func shardKeys(n int, key func(int) string) []string {
	keys := make([]string, n)
	for sh := range keys {
		keys[sh] = key(sh)
	}
	return keys
}
