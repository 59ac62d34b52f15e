// Package tenant is the owners (tenants) of one deployment: their keys,
// read from the tenants file (MOBILE_TENANTS_FILE), and the device keys
// that keep one owner's devices apart from another's inside the cluster.
//
// An owner is taken only from a verified credential, never from a device
// id, a path, a body or a claim. A credential is
// hmt_<owner>.<key id>.<secret>: its public part selects one key in O(1),
// and the SHA-256 of its secret is compared with the key's in constant
// time. The tokens of the environment (MOBILE_TOKEN, MOBILE_EXTRA_TOKENS,
// MOBILE_AGENT_TOKENS, MOBILE_DELIVER_TOKENS) are the legacy owner's,
// whose id is Legacy and whose device keys are the plain device ids.
// docs/tenancy.md describes the model.
package tenant

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/hermes-mobile/gateway/pkg/tokens"
)

// Legacy is the id of the owner of the environment's tokens. No owner of
// the tenants file can have it: an owner id there has 1 to 32 characters.
const Legacy = ""

// Kind says what a key may do.
type Kind string

// The kinds of keys.
const (
	// KindApp connects a phone as any device id of its owner, but one
	// that a device key of its owner binds.
	KindApp Kind = "app"
	// KindDevice connects a phone as its one device (Key.Device).
	KindDevice Kind = "device"
	// KindAgent calls the router API's agent endpoints (sessions, events,
	// blobs, push registrations) for its owner's devices.
	KindAgent Kind = "agent"
	// KindDeliver sends cron's deliveries (POST /v1/deliver, the edge's
	// deliver frame) to its owner's devices.
	KindDeliver Kind = "deliver"
)

// CredentialPrefix starts every owner key's credential.
const CredentialPrefix = "hmt_"

// MaxIDLen bounds an owner id and a key id.
const MaxIDLen = 32

// Key is one credential of an owner, without its secret: the SHA-256 of
// the secret is all it keeps.
type Key struct {
	Owner string
	ID    string
	Kind  Kind
	// Device is the one device id a KindDevice key connects as.
	Device string
	sum    tokens.Digest
}

// Quota is what an owner may use, across the whole cluster
// (docs/tenancy.md): the open reads and sockets are counted in the store
// (store.Leases, under QuotaKey), the outbox bytes by the store's outbox
// bound of the owner's share.
type Quota struct {
	// OutboxMiB bounds the bytes of the owner's outboxes (64).
	OutboxMiB int
	// Connections bounds the owner's open sockets (1,000).
	Connections int
	// EventReads bounds the owner's event reads open at once (8).
	EventReads int
	// DeliveriesPerSecond bounds the deliveries the owner's cron asks in
	// one second of the store's clock (POST /v1/deliver and each item of
	// /v1/deliver/batch), counted in the store's Rates under QuotaKey
	// (1,000).
	DeliveriesPerSecond int
}

// The quota's defaults, for a field the file leaves out.
const (
	DefaultOutboxMiB   = 64
	DefaultConnections = 1000
	DefaultEventReads  = 8
	// DefaultDeliveriesPerSecond is five times what a busy owner's cron
	// asks at its peak (docs/capacity.md), and a tenth of what one router
	// carries a second.
	DefaultDeliveriesPerSecond = 1000
)

// DefaultQuota is the quota of an owner whose file gives none.
func DefaultQuota() Quota {
	return Quota{OutboxMiB: DefaultOutboxMiB, Connections: DefaultConnections, EventReads: DefaultEventReads,
		DeliveriesPerSecond: DefaultDeliveriesPerSecond}
}

// QuotaDeliveries names the deliveries-a-second quota in QuotaKey and in
// the refusals' counts; QuotaOutbox the outbox's (its refusals are items
// dropped past it).
const (
	QuotaDeliveries = "deliveries_per_second"
	QuotaOutbox     = "outbox_mib"
)

// Quotas counted in the store's leases (QuotaKey).
const (
	QuotaEventReads  = "event_reads"
	QuotaConnections = "connections"
)

// QuotaKey is the key in the store that counts owner's use of quota across
// the cluster: of store.Leases for QuotaEventReads and QuotaConnections
// (store.LeaseCount of it is the owner's live count), of store.Rates for
// QuotaDeliveries. It holds no brace, as the store asks.
func QuotaKey(owner, quota string) string { return "quota:" + quota + ":" + owner }

// Limit is q's bound of quota (QuotaEventReads, QuotaConnections); 0 for
// another name.
func (q Quota) Limit(quota string) int {
	switch quota {
	case QuotaEventReads:
		return q.EventReads
	case QuotaConnections:
		return q.Connections
	}
	return 0
}

// QuotaOf is the quota of owner in s, or the defaults when s has no such
// owner (a reload removed it after its credential was verified).
func (s *Snapshot) QuotaOf(owner string) Quota {
	if t := s.Tenant(owner); t != nil {
		return t.Quota
	}
	return DefaultQuota()
}

// Tenant is an owner of the tenants file.
type Tenant struct {
	ID    string
	Keys  []*Key
	Quota Quota
}

// Snapshot is one reading of the tenants file. It is never changed once
// made: a reload makes a new one.
type Snapshot struct {
	Tenants []*Tenant
	owners  map[string]*Tenant
	keys    map[string]*Key // owner + "." + key id
	// bound[owner][device]: a device key of the owner names the device.
	bound map[string]map[string]bool
	sum   [sha256.Size]byte // of the file's bytes
}

// Tenant returns the owner of id, or nil.
func (s *Snapshot) Tenant(id string) *Tenant {
	if s == nil {
		return nil
	}
	return s.owners[id]
}

// Bound reports whether a device key of owner names device: then only
// such a key connects as it.
func (s *Snapshot) Bound(owner, device string) bool {
	return s != nil && s.bound[owner][device]
}

// Has reports whether k is still a key of s with the same secret: a key
// that a reload removed, or whose secret or kind changed, is not.
func (s *Snapshot) Has(k *Key) bool {
	if s == nil || k == nil {
		return false
	}
	cur := s.keys[k.Owner+"."+k.ID]
	return cur != nil && cur.Kind == k.Kind && cur.Device == k.Device && tokens.Equal(cur.sum, k.sum)
}

// IsCredential reports whether token has the form of an owner key's
// credential (it says nothing of whether it is valid).
func IsCredential(token string) bool { return strings.HasPrefix(token, CredentialPrefix) }

// Verify returns the key that credential is, or false. The public part
// (owner and key id) selects the key; the secret's SHA-256 is compared
// with the key's in constant time.
func (s *Snapshot) Verify(credential string) (*Key, bool) {
	owner, id, sec, ok := splitCredential(credential)
	sum := tokens.Sum(sec)
	var k *Key
	if ok && s != nil {
		k = s.keys[owner+"."+id]
	}
	if k == nil {
		// The same work as a key found: the time says no more than the
		// answer does.
		tokens.Equal(sum, tokens.Digest{})
		return nil, false
	}
	if !tokens.Equal(sum, k.sum) {
		return nil, false
	}
	return k, true
}

// splitCredential takes hmt_<owner>.<key id>.<secret> apart.
func splitCredential(c string) (owner, id, sec string, ok bool) {
	rest, ok := strings.CutPrefix(c, CredentialPrefix)
	if !ok {
		return "", "", "", false
	}
	owner, rest, ok1 := strings.Cut(rest, ".")
	id, sec, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !validID(owner) || !validID(id) || sec == "" {
		return "", "", "", false
	}
	return owner, id, sec, true
}

// validID reports whether s is an owner or key id: [a-z0-9-]{1,32}.
func validID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Credential is the credential of a key of owner with id and the secret
// sec: what the phone, the agent or cron presents.
func Credential(owner, id, sec string) string {
	return CredentialPrefix + owner + "." + id + "." + sec
}

// SecretSHA256 is the hex SHA-256 of a secret, as the file's
// secret_sha256 holds it (printf %s "$secret" | sha256sum).
func SecretSHA256(sec string) string {
	s := sha256.Sum256([]byte(sec))
	return hex.EncodeToString(s[:])
}

// The device key of a file owner's device is marker + owner + ":" +
// device id. marker is U+FDD0, a Unicode noncharacter ("permanently
// reserved for internal use"): it is valid UTF-8, so it survives the JSON
// of the bus and the store unchanged, and every subject escapes it. A
// legacy device id that begins with it is refused (CheckLegacyDevice), so
// no legacy id is ever a file owner's device key. The owner id has no ':',
// so the first ':' after it ends it.
const marker = "\uFDD0"

// DeviceKey is the key of device of owner inside the cluster: the store's
// keys, the owner records, the outboxes, the journals, the dedup keys, the
// cards and the events all use it. The legacy owner's is the device id
// itself, so without a tenants file nothing changes.
func DeviceKey(owner, device string) string {
	if owner == Legacy {
		return device
	}
	return marker + owner + ":" + device
}

// Scope is the device key of the device id that a credential of owner
// names (a hello, a path, a body, a deliver's target): DeviceKey, but a
// legacy id that could be taken for a file owner's key is refused. Every
// device id that enters the cluster goes through it.
func Scope(owner, device string) (string, error) {
	if owner == Legacy {
		if err := CheckLegacyDevice(device); err != nil {
			return "", err
		}
	}
	return DeviceKey(owner, device), nil
}

// SplitDeviceKey is the owner and the device id of a device key.
func SplitDeviceKey(key string) (owner, device string) {
	rest, ok := strings.CutPrefix(key, marker)
	if !ok {
		return Legacy, key
	}
	owner, device, ok = strings.Cut(rest, ":")
	if !ok {
		return Legacy, key // never made by DeviceKey
	}
	return owner, device
}

// OwnerOf is the owner of a device key.
func OwnerOf(key string) string {
	o, _ := SplitDeviceKey(key)
	return o
}

// DeviceID is the device id of a device key: what the phone and the API's
// callers see.
func DeviceID(key string) string {
	_, d := SplitDeviceKey(key)
	return d
}

// MayHoldOwnerKey reports whether data (JSON, as pkg/wire writes it, which
// writes U+FDD0 as its UTF-8 bytes, not escaped) may name a file owner's
// device key: false says it names none, so a reader can skip decoding it.
func MayHoldOwnerKey(data []byte) bool { return bytes.Contains(data, []byte(marker)) }

// CheckLegacyDevice refuses a device id of the legacy owner that could be
// taken for a file owner's device key: one that begins with U+FDD0.
func CheckLegacyDevice(id string) error {
	if strings.HasPrefix(id, marker) {
		return fmt.Errorf("a device id may not begin with U+FDD0")
	}
	return nil
}
