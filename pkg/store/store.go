// Package store is the contract for the state that must outlive one
// connection: deduplication keys, multi-part upload buffers, prompt cards,
// device ownership, the offline outbox, media blobs, the event log of the
// agent link and the conversation history of a built-in agent.
//
// Two implementations satisfy it: memstore (one process, the default) and
// redisstore (a cluster). storetest is the one conformance suite both run.
// Every method is safe for concurrent use. Every method that talks to a
// backend returns an error wrapping ErrUnavailable when the backend cannot be
// reached, so callers can tell a retryable failure from a verdict.
package store

import (
	"context"
	"errors"
	"strings"
	"time"
)

// Verdicts, tested with errors.Is.
var (
	// ErrNotFound: no such prompt, blob or upload.
	ErrNotFound = errors.New("store: not found")
	// ErrForbidden: the prompt belongs to another device.
	ErrForbidden = errors.New("store: belongs to another device")
	// ErrTooManyUploads: the device already has MaxOpen unfinished uploads.
	ErrTooManyUploads = errors.New("store: too many unfinished uploads")
	// ErrUploadTooBig: the file or the device's open buffers would exceed their byte limit.
	ErrUploadTooBig = errors.New("store: upload buffer limit exceeded")
	// ErrUploadMismatch: a part disagrees with the upload it continues (parts count).
	ErrUploadMismatch = errors.New("store: part does not match its upload")
	// ErrFull: the store refuses more data (blob capacity).
	ErrFull = errors.New("store: full")
	// ErrUnavailable: the backend cannot be reached; retry later.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrPending: another attempt holds the dedup key and has not confirmed
	// it yet; retry once it has, or once its claim lapsed.
	ErrPending = errors.New("store: claimed by another attempt, not confirmed")
)

// Store is everything the edge and the router keep outside their memory.
type Store interface {
	Dedup
	Uploads
	Prompts
	Owners
	Outbox
	Blobs
	Events
	History
	Journal
	PushTargets
	Leases
	Rates
	Usage
	Close() error
}

// Rates bound what happens in fixed windows of time across every node
// sharing the store (an owner's deliveries a second): a counter per key
// and window, the windows aligned to multiples of their length on the
// store's clock, each forgotten once it is over. What a window refused
// costs nothing; a burst across a boundary may take up to twice the bound
// within one window's length.
//
// Keys must not hold '{' or '}' (redisstore puts the key in a Redis
// Cluster hash tag).
type Rates interface {
	// TakeRate adds n to key's count of the window that holds now if the
	// count stays at most limit, and reports whether it did, the count
	// then and how long until that window ends. window must be positive; n
	// may be 0 (a read).
	TakeRate(ctx context.Context, key string, n, limit int64, window time.Duration) (ok bool, count int64, left time.Duration, err error)
}

// WindowEnd is the end of the window of Rates of length window that holds
// now: windows are aligned to multiples of their length since the Unix
// epoch, so every node puts an instant in the same window.
func WindowEnd(now time.Time, window time.Duration) time.Time {
	ns := now.UnixNano()
	return time.Unix(0, ns-ns%int64(window)+int64(window))
}

// Leases count the holders of a bounded thing across every node sharing
// the store (an owner's open event reads, its open sockets): a counted
// semaphore whose leases expire. A key names one semaphore; an id names
// one holder of it (unique to what holds it: a request, a device). Each
// lease lives ttl from its last Acquire or Renew, by the store's clock
// (memstore.Options.Clock, redisstore.Options.Clock), and is gone once
// that time is not after now; so a node that dies while holding leases
// leaks them only until they expire, and its holders renew them well
// within ttl while they hold (a third of it).
//
// Keys must not hold '{' or '}' (redisstore puts the key in a Redis
// Cluster hash tag).
type Leases interface {
	// AcquireLease takes a lease of key for id for ttl if key has fewer
	// than limit live leases, and reports whether it did and how many live
	// leases key has then. An id that holds a lease of key already keeps
	// it, renewed for ttl, whatever the count: ok is true (a device that
	// reconnects takes its own place). A limit below 1 admits no new id.
	AcquireLease(ctx context.Context, key, id string, limit int, ttl time.Duration) (ok bool, held int, err error)
	// RenewLeases makes each of ids hold a lease of key for ttl from now,
	// in one step, whatever the count: a lease that lapsed or was released
	// meanwhile is taken again, since its holder is still there (so the
	// count may pass a limit for as long as it takes such holders to
	// close). No ids is not an error.
	RenewLeases(ctx context.Context, key string, ids []string, ttl time.Duration) error
	// ReleaseLease ends id's lease of key (none is not an error).
	ReleaseLease(ctx context.Context, key, id string) error
	// LeaseCount returns how many live leases key has.
	LeaseCount(ctx context.Context, key string) (int, error)
}

// PushTargets keeps the push endpoint registered for each device, opaque to
// the store (package push reads it).
type PushTargets interface {
	// SetPushTarget records target for device for ttl, replacing any.
	SetPushTarget(ctx context.Context, device string, target []byte, ttl time.Duration) error
	// PushTarget returns device's target; ErrNotFound when none.
	PushTarget(ctx context.Context, device string) ([]byte, error)
	// DeletePushTarget forgets device's target (none is not an error).
	DeletePushTarget(ctx context.Context, device string) error
}

// Dedup remembers message ids for a window, in two steps, so that a claim
// whose holder died (or whose reply was lost) cannot turn the client's resend
// into a silent loss: Claim records a key as pending for a short ttl, and
// Confirm, once the message has been handed over, records it as delivered
// for the dedup window. Only a confirmed key makes a resend a duplicate; a
// pending one makes it wait (ErrPending) until it is confirmed or lapses.
type Dedup interface {
	// Claim records key as pending for attempt for ttl and reports whether
	// attempt holds it: true when it was free or attempt holds it pending
	// already (a retry after a lost reply), false when key is confirmed (a
	// duplicate), ErrPending when another attempt holds it pending. A retry
	// does not extend the ttl. attempt is a token unique to the delivery
	// attempt.
	Claim(ctx context.Context, key, attempt string, ttl time.Duration) (bool, error)
	// Confirm records key as delivered by attempt for ttl (the dedup
	// window): from then on every Claim of key is a duplicate. It records
	// key also when attempt's pending claim has lapsed; a key confirmed
	// already, or held pending by another attempt, is left as it is (that
	// attempt is delivering the same message again: a duplicate, not a
	// loss).
	Confirm(ctx context.Context, key, attempt string, ttl time.Duration) error
	// Release forgets key if it is still held pending by attempt, for a
	// delivery that failed after Claim and must be retried by the client.
	Release(ctx context.Context, key, attempt string) error
	// Seen reports whether key is confirmed.
	Seen(ctx context.Context, key string) (bool, error)
}

// UploadLimits bound the open multi-part uploads of one device.
type UploadLimits struct {
	MaxOpen      int // unfinished uploads at once
	MaxFileBytes int // one file
	MaxBytes     int // the sum of the device's open buffers
}

// Part is one chunk of a multi-part upload.
type Part struct {
	Device string
	// Conn names the connection that owns the upload; DropUploads frees the
	// uploads of one connection only, so a takeover does not free the new
	// connection's uploads.
	Conn  string
	ID    string // the file id
	Index int
	Count int    // parts of the file
	Meta  []byte // opaque, kept from the first part stored
	Data  []byte
}

// Upload is a completed file.
type Upload struct {
	Meta []byte
	Data []byte
}

// Uploads buffers multi-part uploads under per-device limits, enforced
// atomically across every node sharing the store.
type Uploads interface {
	// PutPart stores p. When p completes its file it returns the assembled
	// file and frees the buffer; otherwise it returns nil. A part that breaks
	// a limit returns ErrTooManyUploads, ErrUploadTooBig or ErrUploadMismatch
	// and the upload it belongs to is discarded. A repeated index replaces the
	// earlier bytes. A part with Count 1 completes at once without being
	// buffered or counted against MaxOpen and MaxBytes; it only fails when
	// it contradicts an open upload of the same id (which is discarded).
	// Uploads are identified by device, Conn and ID.
	PutPart(ctx context.Context, p Part, lim UploadLimits) (*Upload, error)
	// DropUploads frees every unfinished upload that conn holds for device.
	DropUploads(ctx context.Context, device, conn string) error
	// UploadBytes reports the bytes buffered for device.
	UploadBytes(ctx context.Context, device string) (int, error)
}

// PromptRecord is an open card.
type PromptRecord struct {
	ID      string    `json:"id"`
	Device  string    `json:"device"` // the only device that may answer
	Kind    string    `json:"kind"`
	Choices int       `json:"choices"` // proposed answers of a clarify card
	Expires time.Time `json:"expires"`
	Data    []byte    `json:"data,omitempty"` // opaque to the store
}

// Prompts keeps open cards until they are answered or expire.
type Prompts interface {
	// PutPrompt stores p until p.Expires.
	PutPrompt(ctx context.Context, p PromptRecord) error
	// TakePrompt removes and returns the card id if device owns it. It
	// returns ErrNotFound for an unknown or expired card and ErrForbidden,
	// leaving the card in place, when another device owns it.
	TakePrompt(ctx context.Context, id, device string) (PromptRecord, error)
	// TakeExpired removes and returns up to max cards whose Expires is not
	// after now. Each expired card is returned to exactly one caller.
	TakeExpired(ctx context.Context, now time.Time, max int) ([]PromptRecord, error)
}

// Owner is the edge holding a device's socket, fenced by an epoch.
type Owner struct {
	Edge  string
	Epoch int64
}

// Claim is what ClaimDeviceAcks returns.
type Claim struct {
	Epoch int64 // the new epoch
	Acks  bool  // the device acks
	// Prev is the owner record the claim replaced; the zero Owner when
	// there was none (the device's last socket closed, or its record
	// expired).
	Prev Owner
	// Outbox: the device's outbox held items when claimed (some may
	// have expired since). False: it was empty, so a new socket need not
	// read it unless told that something was kept after the claim.
	Outbox bool
}

// Owners records which edge holds each device, and which devices
// acknowledge what they display.
type Owners interface {
	// ClaimDevice makes edge the owner of device for ttl and returns a new
	// epoch, greater than every epoch handed out for device before.
	ClaimDevice(ctx context.Context, device, edge string, ttl time.Duration) (int64, error)
	// ClaimDeviceAcks is ClaimDevice that also reports, read in the same
	// step, whether device acks (SetDeviceAcks recorded it less than its
	// ttl ago) and the owner the claim replaced.
	ClaimDeviceAcks(ctx context.Context, device, edge string, ttl time.Duration) (Claim, error)
	// SetDeviceAcks records for ttl that device acks (it sent an ack),
	// whoever owns it; a record already there lives ttl from now. The
	// record outlives the owner record: ReleaseDevice leaves it.
	SetDeviceAcks(ctx context.Context, device string, ttl time.Duration) error
	// DeviceOwner returns the owner of device; ErrNotFound when none. A
	// record naming an edge whose lease (RenewEdge) lapsed reads as none;
	// one naming an edge that never held a lease (an edge of the release
	// before leases, which refreshes each record instead) stands on its
	// own ttl.
	DeviceOwner(ctx context.Context, device string) (Owner, error)
	// DeviceOwners returns the owner of each device, in order, in one round
	// trip: the zero Owner (epoch 0) for a device that has none, as
	// DeviceOwner reads it.
	DeviceOwners(ctx context.Context, devices []string) ([]Owner, error)
	// RenewEdge keeps edge's lease for ttl: while it lives, the owner
	// records naming edge stand, whatever is left of their own ttl, so an
	// idle phone costs the store nothing between its record's rare
	// refreshes; once it lapses (the edge died, paused, or lost the store)
	// they read as none within a second. fresh reports that the lease did
	// not exist: the edge's first renewal, or its records read as none
	// for a while and senders may have kept outputs in their outboxes.
	RenewEdge(ctx context.Context, edge string, ttl time.Duration) (fresh bool, err error)
	// RefreshDevices extends the ownership of each device still held at the
	// given epoch and returns the devices whose ownership was lost.
	RefreshDevices(ctx context.Context, owned map[string]int64, ttl time.Duration) ([]string, error)
	// ReleaseDevice removes the owner record if it still holds epoch.
	ReleaseDevice(ctx context.Context, device string, epoch int64) error
}

// OutboxItem is one item of an outbox and its sequence number.
type OutboxItem struct {
	// Seq names the item: greater than the Seq of every item pushed before
	// to the same device, also when the outbox was emptied in between.
	Seq  int64
	Data []byte
}

// OutboxLimits bound the outboxes. Past a bound the oldest items are
// dropped: the device's own past MaxItems and MaxBytes; past
// MaxStoreBytes, the oldest item of the largest holder of the store's
// (or the shard's) items, whichever device the push was for.
//
// Holders are two levels: each item is charged to its device within its
// Share (who caused it to be kept). Past MaxStoreBytes the share that
// holds the most bytes is found, then its device that holds the most
// bytes within it, and that device's oldest item of that share is dropped;
// again until the items fit. The device pushed to is a holder like any
// other: when it holds the most, it loses its own oldest. So a device (or
// a share) loses items only while none holds more than it: a flood of
// made-up devices, each holding more than a real one, or all charged to
// one share, pushes out its own items first. Bytes are items' lengths;
// which of two holders of equal bytes loses is not specified.
type OutboxLimits struct {
	// MaxItems bounds one device's items; below 1 nothing is kept.
	MaxItems int
	// MaxBytes bounds the sum of one device's items' lengths; 0 means no
	// bound. An item longer than MaxBytes is not kept (and drops nothing).
	MaxBytes int
	// MaxStoreBytes bounds the sum of the lengths of every device's items
	// in the store; 0 means no bound. redisstore splits it into Shards parts
	// on Redis Cluster, each bounding the devices of one shard. An item
	// longer than its part is not kept. memstore also bounds what the
	// outboxes cost its process in memory (memstore.Options), in the same
	// order.
	MaxStoreBytes int64
	// MaxShareBytes bounds the sum of the lengths of the items charged to
	// lim.Share (an owner's outbox_mib); 0 means no bound. Past it the
	// share's own oldest items are dropped, of its device that holds the
	// most bytes of it first, before the store-wide bound is looked at, so
	// a share that floods loses its own items and nobody else's. An item
	// longer than it is not kept. redisstore splits it into Shards parts
	// on Redis Cluster, as MaxStoreBytes, each bounding the share's devices
	// of one shard.
	MaxShareBytes int64
	// Share names whom the item is charged to one level above its device
	// (see above): the router names the credential that caused the item
	// to be kept ("app", "deliver", "device:<id>", "agent"); an owner
	// (tenant) id fits there too. "" is a share like any other. Shares
	// are few: each costs the store a little state while it holds items.
	Share string
	// TTL is how long the item pushed is kept; it must be positive.
	TTL time.Duration
}

// OutboxDrops counts the items one push dropped unwritten, by reason.
type OutboxDrops struct {
	Full  int // the device's oldest, past MaxItems
	Bytes int // the device's oldest past MaxBytes, or the item pushed when longer than MaxBytes
	// Store: the largest holder's oldest (of this device or another) past
	// the store-wide bound, or the item pushed when longer than its part.
	Store int
	// Share: the share's own oldest (of this device or another of the
	// share) past MaxShareBytes, or the item pushed when longer than it
	// (than its part on Redis Cluster).
	Share   int
	Expired int // past their TTL, removed by this push
}

// Total is the sum of the drops.
func (d OutboxDrops) Total() int { return d.Full + d.Bytes + d.Store + d.Share + d.Expired }

// Outbox keeps frames for a device that is offline. Items are read with
// PeekOutbox and removed only by AckOutbox, once they were written to the
// device, so a reader that dies between the two loses nothing: the next
// reader gets the items again (at least once).
type Outbox interface {
	// PushOutbox appends item to device's outbox, kept for lim.TTL, and
	// drops the oldest items past lim's bounds (see OutboxLimits). It
	// reports what it dropped.
	PushOutbox(ctx context.Context, device string, item []byte, lim OutboxLimits) (OutboxDrops, error)
	// PeekOutbox returns device's live items whose Seq is greater than
	// after, oldest first, and leaves them in the outbox.
	PeekOutbox(ctx context.Context, device string, after int64) ([]OutboxItem, error)
	// AckOutbox removes device's items whose Seq is at most upTo and
	// reports true, if device's owner record holds epoch (the reader's).
	// Items pushed after the reader's peek have greater Seqs and stay. When
	// the record holds another epoch or none it removes nothing and reports
	// false: the items are left to the device's newer connection.
	AckOutbox(ctx context.Context, device string, epoch, upTo int64) (bool, error)
}

// Blobs keeps media bytes so that only references travel on the bus.
type Blobs interface {
	// PutBlob stores data for ttl and returns its key.
	PutBlob(ctx context.Context, data []byte, ttl time.Duration) (string, error)
	// PutBlobIn is PutBlob of a blob of the key space space: its key is
	// BlobKeyIn(space, <random>), so that whoever may read only the keys
	// of one space (an owner, pkg/tenant) cannot name another's. The
	// space "" is PutBlob's.
	PutBlobIn(ctx context.Context, space string, data []byte, ttl time.Duration) (string, error)
	// GetBlob returns the bytes of key; ErrNotFound when gone.
	GetBlob(ctx context.Context, key string) ([]byte, error)
	// ExtendBlob makes key live at least ttl from now (a blob that lives
	// longer already is left as it is), so media an outbox item refers to
	// lasts as long as the item; ErrNotFound when gone.
	ExtendBlob(ctx context.Context, key string, ttl time.Duration) error
}

// BlobKeyIn is the key of the blob of space whose random part is r: r
// itself in the space "", else space + "~" + r. r never holds a '~'.
func BlobKeyIn(space, r string) string {
	if space == "" {
		return r
	}
	return space + "~" + r
}

// BlobSpace is the space of a blob key (BlobKeyIn).
func BlobSpace(key string) string {
	space, _, ok := strings.Cut(key, "~")
	if !ok {
		return ""
	}
	return space
}

// ErrBadCursor: a cursor that no implementation of Events hands out.
var ErrBadCursor = errors.New("store: malformed event cursor")

// EventEntry is one entry of the event log: its cursor and its bytes.
type EventEntry struct {
	Cursor string
	Data   []byte
}

// Events is a log of device events for agents outside the gateway (the
// agent link): the router appends, HTTP clients read from a cursor.
//
// A cursor is an opaque string that names one entry; entries are read in the
// order they were appended, which is the order of their cursors. Every
// implementation makes cursors of the form "<ms>-<seq>" (two decimal
// numbers, as Redis stream ids are), growing with the clock, so a cursor
// kept across a restart of the log never hides newer entries.
type Events interface {
	// AppendEvent adds data at the end of the log and returns its cursor,
	// greater than every cursor handed out before. The log keeps at least
	// the newest maxLen entries and drops older ones, exactly or
	// approximately (redisstore trims whole stream nodes), so it holds
	// about maxLen entries. maxLen must be positive.
	AppendEvent(ctx context.Context, data []byte, maxLen int) (cursor string, err error)
	// ReadEvents returns up to max entries (max < 1 reads one) whose
	// cursors come strictly after after, oldest first; after "" reads from
	// the oldest entry retained. When there are none it waits up to wait
	// for one to be appended and returns an empty slice, not an error, if
	// none comes. A wait of zero does not wait. A ctx deadline bounds the
	// wait: the call returns ctx's error, or an empty slice just before the
	// deadline. A ctx canceled meanwhile may be noticed only when the wait
	// ends (redisstore cannot interrupt a blocking read), so a caller that
	// must stop promptly waits in short steps. A malformed after gives
	// ErrBadCursor.
	ReadEvents(ctx context.Context, after string, max int, wait time.Duration) ([]EventEntry, error)
	// AppendEventIn and ReadEventsIn are AppendEvent and ReadEvents of the
	// log called log: "" is AppendEvent's and ReadEvents' own, any other
	// name (an owner's, pkg/tenant) a log of its own, with cursors of the
	// same form, that no read of another log sees.
	AppendEventIn(ctx context.Context, log string, data []byte, maxLen int) (cursor string, err error)
	ReadEventsIn(ctx context.Context, log, after string, max int, wait time.Duration) ([]EventEntry, error)
}

// HistoryLimits bound one session's history.
type HistoryLimits struct {
	MaxItems int           // items kept, newest first
	MaxBytes int           // the sum of the kept items' lengths
	TTL      time.Duration // the history is forgotten this long after its last append
}

// History keeps the recent conversation of each session, so that any router
// node can continue it. Items are opaque to the store.
type History interface {
	// AppendHistory appends items to session's history in one atomic step
	// (items appended by one call stay together and in order), then drops the
	// oldest items until at most lim.MaxItems remain and their lengths sum to
	// at most lim.MaxBytes; an item longer than lim.MaxBytes is therefore
	// never kept. The history is forgotten lim.TTL after this call.
	// lim.MaxItems and lim.MaxBytes below 1 keep nothing; a lim.TTL that is
	// not positive is an error.
	AppendHistory(ctx context.Context, session string, items [][]byte, lim HistoryLimits) error
	// History returns session's items, oldest first; none for a session
	// without history.
	History(ctx context.Context, session string) ([][]byte, error)
}
