package redisstore

import (
	"hash/crc32"
	"strconv"
)

// Shards is how many parts the state that has no device of its own is split
// into on Redis Cluster: the journals (with their index of due leases), the
// prompt cards (with their expiry index), the blob accounting and the
// store-wide outbox accounting. Each part
// has a hash tag of its own, so the parts spread over the masters and every
// script still touches one slot. The number is fixed: a Store with another
// count would not find what this one wrote.
//
// On a single Redis server (or one behind Sentinel) there is nothing to
// spread over, and each kind stays in one part under the tag it has always
// had ({journals}, {prompts}, {blobs}; the outbox accounting, which came
// later, under {outbox}): the layout of earlier versions, so a rolling
// upgrade of a single-server deployment changes no key.
const Shards = 16

// clusterSlots is Redis Cluster's number of hash slots.
const clusterSlots = 16384

// shardTags are the hash tags of the shards of one kind of state. Shard i's
// tag is chosen so that its slot falls in the i-th sixteenth of the slot
// range: redis-cli --cluster create gives each master a contiguous, equal
// range, so with up to Shards masters every master holds at least one shard
// of each kind (and a random name could put several on one).
type shardTags []string

// newShardTags finds the tags of kind: "<kind>:<i>", or "<kind>:<i>.<k>"
// with the smallest k that lands in the shard's range.
func newShardTags(kind string) shardTags {
	tags := make(shardTags, Shards)
	for i := range tags {
		base := kind + ":" + strconv.Itoa(i)
		for k := 0; ; k++ {
			t := base
			if k > 0 {
				t += "." + strconv.Itoa(k)
			}
			if int(keySlot(t))*Shards/clusterSlots == i {
				tags[i] = "{" + t + "}"
				break
			}
		}
	}
	return tags
}

// layout is the hash tags of each kind of shared state.
type layout struct {
	journals, prompts, blobs, outbox shardTags
}

var (
	clusterLayout = layout{newShardTags("journals"), newShardTags("prompts"), newShardTags("blobs"), newShardTags("outbox")}
	serverLayout  = layout{shardTags{"{journals}"}, shardTags{"{prompts}"}, shardTags{"{blobs}"}, shardTags{"{outbox}"}}
)

// of is the shard of name (a device, a card id, a blob key).
func (t shardTags) of(name string) int {
	if len(t) == 1 {
		return 0
	}
	return int(crc32.ChecksumIEEE([]byte(name)) % uint32(len(t)))
}

// keySlot is Redis Cluster's slot of a key whose hash tag is the whole of
// tag: CRC16 (XMODEM) modulo 16384.
func keySlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % clusterSlots
}
