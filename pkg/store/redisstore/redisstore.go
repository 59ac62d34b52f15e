// Package redisstore is the store.Store of a cluster: every edge and router
// node shares one Redis, so deduplication, upload limits, prompt cards, device
// ownership, outboxes and blobs hold across nodes.
//
// # Atomicity
//
// Every operation that reads and then writes runs as one Lua script, so it is
// atomic across nodes: Claim, Release, PutPart, DropUploads, TakePrompt,
// TakeExpired, ClaimDevice, RefreshDevices (one script per device, pipelined),
// ReleaseDevice, PushOutbox, PeekOutbox, AckOutbox, AppendHistory, the blob
// accounting of PutBlob, AcquireLease, RenewLeases, TakeRate and AddUsage
// (one script per owner, pipelined).
// The keys one script touches share a Redis Cluster hash tag: the device's
// ({D}), or on a cluster client one of the Shards of the journals, the
// cards, the blob accounting and the store-wide outbox accounting (see
// Shards; on a single server the one tag {journals}, {prompts}, {blobs} or
// {outbox}). Options.Mode selects a single
// server, a Redis Cluster or a Sentinel-watched primary; all three are
// tested. Device ids must not be empty on Redis Cluster (an empty hash tag
// does not group keys).
//
// # Keys
//
// Every key starts with Options.Prefix (P, "hermes:" by default) and every key
// has a TTL, so nothing outlives the state it holds. D is a device, C a
// connection, F a file id, S a session, len(x) the byte length of x in decimal:
//
//	P dedup:<key>                         string  the attempt holding key pending, "!<attempt>" once confirmed;
//	                                              PX the Claim ttl, then the Confirm ttl
//	P uploads:{D}                         hash    <upload> -> bytes buffered; PX UploadTTL from D's last part
//	P upload:<len(D)>:{D}:<upload>        hash    "count", "meta" and one field per part index; PX UploadTTL from its last part
//	                                              (<upload> is <len(C)>:<C>:<F>)
//	P {prompts}:card:<id>                 hash    "device", "expires" (unix µs), "rec" (the PromptRecord as JSON);
//	                                              PX until Expires + PromptGrace
//	P {prompts}:due                       zset    card id scored by Expires (unix µs); PX its longest card's
//	P owner:{D}                           string  "<edge>|<epoch>"; PX the claim or refresh ttl; stands while
//	                                              P edge:{<edge>} lives, or when P edge:{<edge>}:seen does not exist
//	P epoch:{D}                           string  the last epoch handed out for D; PX the claim or refresh ttl
//	P edge:{E}                            string  "1": edge E's lease; PX the ttl of its last RenewEdge
//	P edge:{E}:seen                       string  "1": E holds leases; PX 24 h from its last RenewEdge
//	P acks:{D}                            string  "1": D acks (SetDeviceAcks); PX the ttl of the last SetDeviceAcks
//	P outbox:{D}                          list    "<seq>|<deadline unix ms>|<item>", oldest first; PX its longest item's ttl
//	P outboxseq:{D}                       string  the last seq handed out for D's outbox; PX at least the outbox's
//	P pushto:{D}                          string  D's push endpoint (package push's JSON); PX the registration's ttl (30 days)
//	P outboxbytes:{D}                     string  the bytes of D's outbox items; PX as the outbox
//	P {outbox}:deadlines                  zset    "<len>:<seq>:<D>" of every outbox item pushed with a store-wide
//	                                              bound, scored by deadline (unix ms); PX its longest item's
//	P {outbox}:sum                        string  bytes of the items in {outbox}:deadlines; as {outbox}:deadlines
//	P {outbox}:share                      hash    "<len>:<seq>:<D>" -> the share the item is charged to; as above
//	P {outbox}:shares                     zset    share -> bytes of its items; as above
//	P {outbox}:devices:<share>            zset    D -> bytes of D's items of share; PX the longest of them
//	P {outbox}:order                      zset    "<len(share)>:<share><len(D)>:<D><seq, 20 digits>:<len>", all
//	                                              scored 0: each device's items of each share, oldest first; as above
//	P {outbox}:due                        zset    the release before's accounting ("<len>:<seq>:<D>" by deadline),
//	P {outbox}:bytes                      string  and its bytes: no longer written, read until its items are gone
//	P blob:<32 hex>                       string  the blob; PX its ttl (with MaxBlobBytes: PXAT its deadline in {blobs}:due)
//	P {blobs}:due                         zset    "<size>:<32 hex>" scored by deadline (unix ms); PX its longest blob's;
//	                                              only with MaxBlobBytes
//	P {blobs}:bytes                       string  bytes of the blobs in {blobs}:due; as {blobs}:due
//	P history:{S}                         list    session S's conversation items, oldest first; PX the TTL of its last append
//	P {journals}:log:<D>                  list    D's journal, "<seq>|<entry>", oldest first; PX the TTL of its last append
//	P {journals}:meta:<D>                 hash    "seq", "owner", "until" (the lease); PX as the log
//	P {journals}:due                      zset    D scored by its lease deadline (0: free, with entries); see journal.go
//	P lease:{K}                           zset    the holders of semaphore K (store.Leases) scored by their lease's
//	                                              deadline (unix ms, Options.Clock); PX its longest lease's ttl
//	P usage:{O}                           hash    owner O's counters (pkg/usage's names) -> their sums over every node, "since"
//	                                              (unix ms) -> when they began; PX the ttl of its last AddUsage (400 days)
//
// # Expiry
//
// Redis expires the keys. Upload buffers expire UploadTTL (10 minutes by
// default) after their last part, so the buffers of an edge that died do not
// stay: each PutPart first drops from P uploads:{D} the uploads whose buffer
// key is gone, and UploadBytes counts only live buffers, so the per-device
// limits heal by themselves. Outbox items carry their own deadline and
// PeekOutbox skips the passed ones, so an old item is forgotten while a newer
// one stays. Expired prompt cards stay PromptGrace (1 hour by default) after
// their Expires for TakeExpired, which is how the router learns that a card
// timed out; a card not taken by then is lost without a report.
//
// Epochs: when P epoch:{D} is missing (never claimed, expired or evicted),
// ClaimDevice starts it from the Redis server clock in microseconds (and
// above the epoch of a still-present owner), so epochs keep growing without a
// key per device kept forever. Epochs are therefore about 1.8e15: larger than
// memstore's, still exact as float64 and in JavaScript. This relies on the
// Redis clock not stepping back while a device's epoch key is missing.
// Outbox sequence numbers start the same way when P outboxseq:{D} is missing
// (and above the outbox's last item), so an AckOutbox that arrives after
// the outbox was emptied and filled again cannot remove the new items.
//
// # Errors
//
// Network errors, timeouts, a closed client and the replies LOADING,
// READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, BUSY and
// "max number of clients" wrap store.ErrUnavailable, together with the
// underlying error, so a call whose context ended while Redis was being asked
// matches both store.ErrUnavailable and context.DeadlineExceeded (or
// context.Canceled). OOM (maxmemory reached) wraps both store.ErrFull and
// store.ErrUnavailable. Other replies (NOAUTH, WRONGTYPE, a script error…)
// are configuration or programming errors and wrap neither. A context that
// is already done returns its error before Redis is asked, without
// store.ErrUnavailable.
//
// # Lost replies
//
// A call whose reply is lost (the connection breaks after Redis ran it)
// fails with store.ErrUnavailable although it took effect. For a Take
// (TakePrompt, TakeExpired, or the PutPart that completes a file)
// what it took is then lost: it is never returned twice. The client that New
// makes therefore does not retry commands: a retry would turn that loss into
// a silent one (the retried Take finds nothing), push an outbox item twice or
// count a blob twice. A Client passed in Options should be configured the
// same way (MaxRetries -1).
//
// Redis 6.2 or later is required (SET … PXAT); the tests run on Redis 7.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// Defaults for the zero Options.
const (
	DefaultPrefix      = "hermes:"
	DefaultUploadTTL   = 10 * time.Minute
	DefaultPromptGrace = time.Hour
	// DefaultPoolSize is the most connections a Store's client keeps for
	// commands when neither Options.PoolSize nor the URL's pool_size says:
	// go-redis's own default, 10 per CPU, would have 30 edges on 64-core
	// nodes open 19,200 connections to one Redis.
	DefaultPoolSize = 32
)

// errBadTTL rejects a ttl that is zero or negative: nothing would be kept.
var errBadTTL = errors.New("redisstore: ttl must be positive")

// Options configure a Store. URL or Client is required.
type Options struct {
	// URL is the Redis to use, redis://[user:password@]host:port[/db] or
	// rediss://…, parsed by redis.ParseURL (its query options, such as
	// dial_timeout or pool_size, apply). New sets three options of the
	// client: ContextTimeoutEnabled, so the caller's context bounds every
	// call even when Redis stops answering; DialerRetries 1, so a call to a
	// Redis that refuses connections fails at once rather than after about
	// 2 s of redialing; and, unless the URL sets max_retries, no command
	// retries (see the package comment). The pool holds at most PoolSize
	// connections for commands, unless the URL sets pool_size.
	URL string
	// Mode says what URL names: ModeSingle (the default when empty),
	// ModeCluster or ModeSentinel; see each for its URL's form.
	Mode string
	// PoolSize bounds the connections of the client New makes from URL
	// (REDIS_POOL_SIZE); a command that finds them all busy waits for one
	// up to the pool timeout. A pool_size in URL wins over it; zero or
	// negative means DefaultPoolSize. go-redis keeps up to 10 more for
	// pipelines.
	PoolSize int
	// Client, when set, is used instead of URL, as it is configured, and is
	// not closed by Close. It may be a cluster client; see the package
	// comment.
	Client redis.UniversalClient
	// Prefix starts every key; empty means DefaultPrefix ("hermes:"). It must
	// not contain '{' or '}' (they would change the Redis Cluster hash tags).
	Prefix string
	// MaxBlobBytes bounds the total size of the live blobs, as in memstore: a
	// PutBlob that would take the total above it fails with store.ErrFull.
	// Zero or negative means no bound of ours; Redis maxmemory is then the
	// bound (an OOM reply is store.ErrFull too).
	MaxBlobBytes int64
	// UploadTTL is how long an unfinished upload buffer lives after its last
	// part. Zero or negative means DefaultUploadTTL (10 minutes).
	UploadTTL time.Duration
	// PromptGrace is how long an expired prompt card is kept for
	// TakeExpired. Zero or negative means DefaultPromptGrace (1 hour).
	PromptGrace time.Duration
	// Clock is what TakePrompt compares a card's Expires with; give it the
	// clock the router sets Expires by, and what the deadlines of
	// store.Leases are set and checked by. Nil means the system clock.
	// (Edges' leases and key TTLs are Redis's own clock.)
	Clock clock.Clock
	// Telemetry receives the client's pool stats and the operations Redis
	// failed (hermes_redis_*), and, when it traces, a span per Redis
	// command (redisotel; without the commands' arguments) on the client
	// New makes. Nil records nothing.
	Telemetry *telemetry.Telemetry
}

// Store keeps the shared state in Redis. Create it with New and release its
// connections with Close. All methods are safe for concurrent use.
type Store struct {
	rdb          redis.UniversalClient
	ownClient    bool // rdb was made by New, so Close closes it
	prefix       string
	maxBlobBytes int64
	uploadTTL    time.Duration
	promptGrace  time.Duration
	clock        clock.Clock
	tags         layout        // the hash tags of the shared state: serverLayout or clusterLayout
	turn         atomic.Uint64 // where the next sweep of the shards starts
	leases       leaseCache    // what was read of edges' leases (leases.go)

	metrics     *telemetry.Metrics // nil-safe
	stopObserve func() error

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// New connects to Redis, checks it with PING and returns the Store. It
// returns an error wrapping store.ErrUnavailable when Redis cannot be reached.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains a brace", opts.Prefix)
	}
	if opts.UploadTTL <= 0 {
		opts.UploadTTL = DefaultUploadTTL
	}
	if opts.PromptGrace <= 0 {
		opts.PromptGrace = DefaultPromptGrace
	}
	s := &Store{
		rdb:          opts.Client,
		prefix:       opts.Prefix,
		maxBlobBytes: opts.MaxBlobBytes,
		uploadTTL:    opts.UploadTTL,
		promptGrace:  opts.PromptGrace,
		clock:        clock.Or(opts.Clock),
		tags:         serverLayout,
	}
	if s.rdb == nil {
		if opts.URL == "" {
			return nil, errors.New("redisstore: neither URL nor Client is set")
		}
		rdb, err := NewClient(opts.Mode, opts.URL, opts.PoolSize)
		if err != nil {
			return nil, fmt.Errorf("redisstore: %w", err)
		}
		s.rdb, s.ownClient = rdb, true
		if m := opts.Telemetry.Metrics(); m != nil {
			s.rdb.AddHook(durationHook{m})
		}
		if opts.Telemetry.Tracing() {
			// Command names and timings only: arguments hold message
			// texts, files and device ids, which spans never carry.
			if err := redisotel.InstrumentTracing(s.rdb, redisotel.WithTracerProvider(opts.Telemetry.TracerProvider()),
				redisotel.WithDBStatement(false), redisotel.WithCallerEnabled(false)); err != nil {
				s.Close()
				return nil, opErr("New: tracing", err)
			}
		}
	}
	if _, ok := s.rdb.(*redis.ClusterClient); ok {
		s.tags = clusterLayout
	}
	if err := ctx.Err(); err != nil {
		s.Close()
		return nil, opErr("New", err)
	}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		s.Close()
		return nil, redisErr(ctx, "New: ping", err)
	}
	if m := opts.Telemetry.Metrics(); m != nil {
		s.metrics = m
		s.stopObserve = m.ObserveRedis(func() telemetry.PoolStats {
			st := s.rdb.PoolStats()
			return telemetry.PoolStats{Hits: uint64(st.Hits), Misses: uint64(st.Misses), Timeouts: uint64(st.Timeouts),
				Conns: int64(st.TotalConns), Idle: int64(st.IdleConns), Max: int64(s.PoolSize())}
		})
	}
	return s, nil
}

// durationHook records each command's and pipeline's duration, from the
// call (the wait for a pool connection included) to its reply.
type durationHook struct{ m *telemetry.Metrics }

func (durationHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h durationHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		h.m.RedisCommand(time.Since(start))
		return err
	}
}

func (h durationHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		h.m.RedisCommand(time.Since(start))
		return err
	}
}

// PoolSize is the most connections the client keeps for commands; 0 for a
// client given in Options.Client that is not a *redis.Client.
func (s *Store) PoolSize() int {
	if c, ok := s.rdb.(*redis.Client); ok {
		return c.Options().PoolSize
	}
	return 0
}

// Close closes the Redis client unless it came from Options.Client. It is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.stopObserve != nil {
			s.closeErr = s.stopObserve()
		}
		if s.ownClient {
			s.closeErr = errors.Join(s.closeErr, s.rdb.Close())
		}
	})
	return s.closeErr
}

// Key names; see the package comment.

func (s *Store) dedupKey(key string) string { return s.prefix + "dedup:" + key }

func (s *Store) uploadsKey(device string) string { return s.prefix + "uploads:{" + device + "}" }

// uploadKeyPrefix is the key of device's upload buffers without the upload
// name. The lengths make the name of every (device, conn, file id) distinct.
func (s *Store) uploadKeyPrefix(device string) string {
	return s.prefix + "upload:" + strconv.Itoa(len(device)) + ":{" + device + "}:"
}

// uploadName names an upload within its device.
func uploadName(conn, id string) string { return connPrefix(conn) + id }

// connPrefix is how the upload names of conn begin.
func connPrefix(conn string) string { return strconv.Itoa(len(conn)) + ":" + conn + ":" }

func (s *Store) cardKeyPrefix(shard int) string {
	return s.prefix + s.tags.prompts[shard] + ":card:"
}
func (s *Store) dueKey(shard int) string   { return s.prefix + s.tags.prompts[shard] + ":due" }
func (s *Store) ownerKey(d string) string  { return s.prefix + "owner:{" + d + "}" }
func (s *Store) epochKey(d string) string  { return s.prefix + "epoch:{" + d + "}" }
func (s *Store) outboxKey(d string) string { return s.prefix + "outbox:{" + d + "}" }
func (s *Store) acksKey(d string) string   { return s.prefix + "acks:{" + d + "}" }
func (s *Store) blobKey(key string) string { return s.prefix + "blob:" + key }
func (s *Store) blobDueKey(shard int) string {
	return s.prefix + s.tags.blobs[shard] + ":due"
}
func (s *Store) blobBytesKey(shard int) string { return s.prefix + s.tags.blobs[shard] + ":bytes" }

// ms returns d in whole milliseconds, rounded up, for PX and PEXPIRE.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// opErr wraps an error of op that did not come from Redis.
func opErr(op string, err error) error { return fmt.Errorf("redisstore: %s: %w", op, err) }

// redisErr is the package's redisErr, counting the failure in the metrics
// unless it was the caller that ended the call (ctx canceled).
func (s *Store) redisErr(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
	case redis.IsOOMError(err):
		s.metrics.RedisError(telemetry.RedisFull)
	case unavailable(err):
		s.metrics.RedisError(telemetry.RedisUnavailable)
	default:
		s.metrics.RedisError(telemetry.RedisReply)
	}
	return redisErr(ctx, op, err)
}

// redisErr wraps an error that a Redis call of op with ctx returned, adding
// store.ErrUnavailable when a retry may succeed, and ctx's error when ctx
// ended meanwhile; see the package comment.
func redisErr(ctx context.Context, op string, err error) error {
	if cerr := ctxEnded(ctx); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	switch {
	case redis.IsOOMError(err):
		return fmt.Errorf("redisstore: %s: %w: %w: %w", op, store.ErrFull, store.ErrUnavailable, err)
	case unavailable(err):
		return fmt.Errorf("redisstore: %s: %w: %w", op, store.ErrUnavailable, err)
	default:
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
}

// ctxEnded returns ctx's error, or context.DeadlineExceeded when ctx's
// deadline has passed but its timer has not fired yet (the socket deadline,
// taken from ctx, can fire first).
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// unavailable reports whether err means that Redis cannot serve the call
// now: every error that is not a Redis reply (network, timeout, pool, closed
// client, context), and the replies of a server that is starting, failing
// over or overloaded.
func unavailable(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsClusterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY") ||
		// A cluster client gives MOVED or ASK back once its redirects ran
		// out while a failover moved the slot: a retry finds the new map.
		redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// replyInt reads element i of a script's array reply as an int64.
func replyInt(r []any, i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("script reply has %d elements, want more than %d", len(r), i)
	}
	n, ok := r[i].(int64)
	if !ok {
		return 0, fmt.Errorf("script reply element %d is %T, want an integer", i, r[i])
	}
	return n, nil
}

// replyBytes reads element i of a script's array reply as bytes.
func replyBytes(r []any, i int) ([]byte, error) {
	if i >= len(r) {
		return nil, fmt.Errorf("script reply has %d elements, want more than %d", len(r), i)
	}
	str, ok := r[i].(string)
	if !ok {
		return nil, fmt.Errorf("script reply element %d is %T, want a string", i, r[i])
	}
	return []byte(str), nil
}
