package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// refreshBatch is how many devices one pipeline of RefreshDevices carries.
const refreshBatch = 512

// claimDeviceScript hands out the next epoch of a device and records the
// owner. A missing epoch key starts from the server clock in µs and above the
// current owner's epoch; see the package comment. It also reads whether the
// device acks and the owner record it replaces, so the hello learns both
// without another round trip.
// KEYS: owner, epoch, acks, outbox. ARGV: edge, ttl ms. Reply: {the epoch,
// 1 if the device acks else 0, the replaced owner record or "", 1 if the
// outbox exists else 0}.
var claimDeviceScript = redis.NewScript(`
local n
local cur = redis.call('GET', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
	n = redis.call('INCR', KEYS[2])
else
	local t = redis.call('TIME')
	n = tonumber(t[1]) * 1000000 + tonumber(t[2])
	if cur then
		local e = tonumber(string.match(cur, '|(%d+)$'))
		if e and e >= n then
			n = e + 1
		end
	end
	redis.call('SET', KEYS[2], string.format('%.0f', n))
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. string.format('%.0f', n), 'PX', ARGV[2])
return {n, redis.call('EXISTS', KEYS[3]), cur or '', redis.call('EXISTS', KEYS[4])}
`)

// refreshDeviceScript extends the ownership held at an epoch.
// KEYS: owner, epoch. ARGV: epoch, ttl ms. Reply: 1 extended, 0 lost.
var refreshDeviceScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and string.match(cur, '|(%d+)$') == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	redis.call('PEXPIRE', KEYS[2], ARGV[2])
	return 1
end
return 0
`)

// releaseDeviceScript deletes the owner record held at an epoch.
// KEYS: owner. ARGV: epoch. Reply: 1 deleted, 0 not.
var releaseDeviceScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and string.match(cur, '|(%d+)$') == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0
`)

// ClaimDevice makes edge the owner of device for ttl and returns a new epoch.
func (s *Store) ClaimDevice(ctx context.Context, device, edge string, ttl time.Duration) (int64, error) {
	c, err := s.claimDevice(ctx, "ClaimDevice", device, edge, ttl)
	return c.Epoch, err
}

// ClaimDeviceAcks is ClaimDevice that also reports whether device acks and
// the owner it replaced, read by the same script.
func (s *Store) ClaimDeviceAcks(ctx context.Context, device, edge string, ttl time.Duration) (store.Claim, error) {
	return s.claimDevice(ctx, "ClaimDeviceAcks", device, edge, ttl)
}

func (s *Store) claimDevice(ctx context.Context, op, device, edge string, ttl time.Duration) (store.Claim, error) {
	if err := ctx.Err(); err != nil {
		return store.Claim{}, opErr(op, err)
	}
	if ttl <= 0 {
		return store.Claim{}, errBadTTL
	}
	keys := []string{s.ownerKey(device), s.epochKey(device), s.acksKey(device), s.outboxKey(device)}
	r, err := claimDeviceScript.Run(ctx, s.rdb, keys, edge, ms(ttl)).Slice()
	if err != nil {
		return store.Claim{}, s.redisErr(ctx, op, err)
	}
	if len(r) != 4 {
		return store.Claim{}, opErr(op, fmt.Errorf("claim reply %v", r))
	}
	epoch, ok1 := r[0].(int64)
	acks, ok2 := r[1].(int64)
	prev, ok3 := r[2].(string)
	outbox, ok4 := r[3].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return store.Claim{}, opErr(op, fmt.Errorf("claim reply %v", r))
	}
	c := store.Claim{Epoch: epoch, Acks: acks == 1, Outbox: outbox == 1}
	if prev != "" {
		if c.Prev, err = parseOwner(op, prev); err != nil {
			return store.Claim{}, err
		}
	}
	return c, nil
}

// SetDeviceAcks records for ttl that device acks.
func (s *Store) SetDeviceAcks(ctx context.Context, device string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return opErr("SetDeviceAcks", err)
	}
	if ttl <= 0 {
		return errBadTTL
	}
	if err := s.rdb.Set(ctx, s.acksKey(device), "1", ttl).Err(); err != nil {
		return s.redisErr(ctx, "SetDeviceAcks", err)
	}
	return nil
}

// DeviceOwner returns the owner of device; store.ErrNotFound when none.
func (s *Store) DeviceOwner(ctx context.Context, device string) (store.Owner, error) {
	if err := ctx.Err(); err != nil {
		return store.Owner{}, opErr("DeviceOwner", err)
	}
	v, err := s.rdb.Get(ctx, s.ownerKey(device)).Result()
	if errors.Is(err, redis.Nil) {
		return store.Owner{}, store.ErrNotFound
	}
	if err != nil {
		return store.Owner{}, s.redisErr(ctx, "DeviceOwner", err)
	}
	o, err := parseOwner("DeviceOwner", v)
	if err != nil {
		return store.Owner{}, err
	}
	owners := []store.Owner{o}
	if err := s.standing(ctx, "DeviceOwner", owners); err != nil {
		return store.Owner{}, err
	}
	if owners[0].Edge == "" {
		return store.Owner{}, store.ErrNotFound
	}
	return o, nil
}

// DeviceOwners reads the devices' owner records in one pipeline (not MGET:
// with a cluster client the keys may live on different nodes); the zero
// Owner for a device that has none.
func (s *Store) DeviceOwners(ctx context.Context, devices []string) ([]store.Owner, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("DeviceOwners", err)
	}
	if len(devices) == 1 { // a plain GET costs less than a pipeline of one
		o, err := s.DeviceOwner(ctx, devices[0])
		if errors.Is(err, store.ErrNotFound) {
			err = nil
		}
		return []store.Owner{o}, err
	}
	cmds := make([]*redis.StringCmd, len(devices))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, d := range devices {
			cmds[i] = p.Get(ctx, s.ownerKey(d))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, s.redisErr(ctx, "DeviceOwners", err)
	}
	owners := make([]store.Owner, len(devices))
	for i, c := range cmds {
		v, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, s.redisErr(ctx, "DeviceOwners", err)
		}
		if owners[i], err = parseOwner("DeviceOwners", v); err != nil {
			return nil, err
		}
	}
	if err := s.standing(ctx, "DeviceOwners", owners); err != nil {
		return nil, err
	}
	return owners, nil
}

// parseOwner reads an owner record, "<edge>|<epoch>".
func parseOwner(op, v string) (store.Owner, error) {
	i := strings.LastIndexByte(v, '|')
	epoch, err := strconv.ParseInt(v[i+1:], 10, 64)
	if i < 0 || err != nil {
		return store.Owner{}, opErr(op, fmt.Errorf("malformed owner record %q", v))
	}
	return store.Owner{Edge: v[:i], Epoch: epoch}, nil
}

// RefreshDevices extends the ownership of each device still held at the
// given epoch for ttl and returns the others, sorted. Each device is checked
// and extended atomically; the devices are sent in pipelines of
// refreshBatch.
func (s *Store) RefreshDevices(ctx context.Context, owned map[string]int64, ttl time.Duration) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, opErr("RefreshDevices", err)
	}
	if ttl <= 0 {
		return nil, errBadTTL
	}
	var lost []string
	for batch := range slices.Chunk(slices.Sorted(maps.Keys(owned)), refreshBatch) {
		held, err := s.refresh(ctx, batch, owned, ms(ttl))
		if err != nil {
			return nil, s.redisErr(ctx, "RefreshDevices", err)
		}
		for i, device := range batch {
			if !held[i] {
				lost = append(lost, device)
			}
		}
	}
	return lost, nil
}

// refresh runs refreshDeviceScript for devices in one pipeline and reports
// which are still held. The pipeline uses EVALSHA; when Redis lost the script
// (a restart, SCRIPT FLUSH), it loads it and runs the pipeline again.
func (s *Store) refresh(ctx context.Context, devices []string, owned map[string]int64, ttlMS int64) ([]bool, error) {
	for try := 0; ; try++ {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(devices))
		for i, d := range devices {
			cmds[i] = refreshDeviceScript.EvalSha(ctx, pipe, []string{s.ownerKey(d), s.epochKey(d)},
				strconv.FormatInt(owned[d], 10), ttlMS)
		}
		_, err := pipe.Exec(ctx)
		if err != nil && try == 0 && noScript(cmds) {
			if err := refreshDeviceScript.Load(ctx, s.rdb).Err(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		held := make([]bool, len(devices))
		for i, c := range cmds {
			n, err := c.Int64()
			if err != nil {
				return nil, err
			}
			held[i] = n == 1
		}
		return held, nil
	}
}

// noScript reports whether one of cmds failed because Redis does not know
// its script.
func noScript(cmds []*redis.Cmd) bool {
	for _, c := range cmds {
		if isNoScript(c.Err()) {
			return true
		}
	}
	return false
}

// isNoScript reports whether err is Redis not knowing a script.
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// ReleaseDevice removes the owner record of device if it holds epoch.
func (s *Store) ReleaseDevice(ctx context.Context, device string, epoch int64) error {
	if err := ctx.Err(); err != nil {
		return opErr("ReleaseDevice", err)
	}
	err := releaseDeviceScript.Run(ctx, s.rdb, []string{s.ownerKey(device)}, strconv.FormatInt(epoch, 10)).Err()
	if err != nil {
		return s.redisErr(ctx, "ReleaseDevice", err)
	}
	return nil
}
