package dispatch

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// OutboxConfig configures an Outbox: what is kept for a device that holds
// no socket, and how the device is woken to read it. Zero values take the
// defaults.
type OutboxConfig struct {
	// Max bounds the frames kept for an offline device
	// (MOBILE_OUTBOX_MAX, 1024); the oldest are dropped first.
	Max int
	// TTL is how long they are kept (MOBILE_OUTBOX_TTL, 24 h): a phone
	// that sleeps through the night finds them in the morning. It is the
	// longest ttl a delivery may ask for, too.
	TTL time.Duration
	// Bytes bounds the bytes of the frames kept for one offline device
	// (MOBILE_OUTBOX_MIB, 32 MiB); the oldest are dropped first. Media
	// are kept by reference (the blob's key), so a frame is small.
	Bytes int
	// StoreBytes bounds the bytes of every device's outbox in the store
	// together (MOBILE_MAX_OUTBOX_MIB, 1024 MiB); past it the store's
	// oldest frames are dropped, whichever device they wait for.
	StoreBytes int64

	// PushKey signs the webhook push notifications (MOBILE_PUSH_KEY);
	// see package push.
	PushKey secret.Secret
	// PushEvery: at most one push notification per device per this long
	// (MOBILE_PUSH_EVERY, 15 min): one per burst of output.
	PushEvery time.Duration
	// PushContent puts the waiting message's text in push notifications
	// (MOBILE_PUSH_CONTENT); off, they say only that something waits.
	PushContent bool
	// PushBackoff is the first wait between a notification's attempts (1
	// s), doubling up to 1 min; tests shorten it.
	PushBackoff time.Duration
	// PushAllowPrivate lets push endpoints be at private addresses
	// (MOBILE_PUSH_ALLOW_PRIVATE): a self-hosted ntfy on the LAN. See
	// push.Policy.
	PushAllowPrivate bool
	// PushAllowNets lets push endpoints be in these networks, whatever
	// they are, comma-separated CIDRs (MOBILE_PUSH_ALLOW_NETS): one LAN's
	// subnet, or loopback for tests. Metadata addresses stay refused.
	PushAllowNets string
	// PushServices turns on FCM and APNs (MOBILE_PUSH_FCM_*,
	// MOBILE_PUSH_APNS_*), whose notifications expire after TTL.
	PushServices PushServices

	// OpTimeout bounds one store or bus call of keeping an output (the
	// push to the outbox, the reread notice): DefaultOpTimeout, or the
	// router's MOBILE_ROUTER_OP_TIMEOUT, which pkg/gateway passes on.
	OpTimeout time.Duration

	// Telemetry receives the outbox's and the push notifications' series
	// (hermes_outbox_queued_total, hermes_push_*: a router's, in
	// docs/metrics.md); nil records nothing.
	Telemetry *telemetry.Telemetry

	// Tenants, when set, is the tenants file: what is kept for an owner's
	// devices (its share, OwnerShare) is bounded by the owner's
	// outbox_mib (store.OutboxLimits.MaxShareBytes). Nil: no owner's bound.
	Tenants *tenant.Registry
	// Usage, when set, counts the items an owner's outbox_mib dropped as
	// the owner's refusals (usage.RefusedOutbox).
	Usage *usage.Recorder
}

// The outbox's defaults: what is kept for a phone that sleeps.
const (
	DefaultOutboxMax        = 1024
	DefaultOutboxTTL        = 24 * time.Hour
	DefaultOutboxBytes      = 32 << 20
	DefaultOutboxStoreBytes = 1024 << 20
	DefaultPushEvery        = 15 * time.Minute
	// DefaultOpTimeout bounds one store or bus call of keeping an output,
	// and the router's by default (MOBILE_ROUTER_OP_TIMEOUT).
	DefaultOpTimeout = 5 * time.Second
)

// DefaultOutboxConfig is the configuration a zero OutboxConfig stands
// for, so that flags show the real defaults without repeating them.
func DefaultOutboxConfig() OutboxConfig {
	var c OutboxConfig
	c.setDefaults()
	return c
}

func (c *OutboxConfig) setDefaults() {
	if c.Max <= 0 {
		c.Max = DefaultOutboxMax
	}
	if c.TTL <= 0 {
		c.TTL = DefaultOutboxTTL
	}
	if c.Bytes <= 0 {
		c.Bytes = DefaultOutboxBytes
	}
	if c.StoreBytes <= 0 {
		c.StoreBytes = DefaultOutboxStoreBytes
	}
	if c.PushEvery <= 0 {
		c.PushEvery = DefaultPushEvery
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
}

// Limits are the store's bounds of the outboxes, for an item kept for
// ttl (TTL when ttl is not positive or longer).
func (c OutboxConfig) Limits(ttl time.Duration) store.OutboxLimits {
	if ttl <= 0 || ttl > c.TTL {
		ttl = c.TTL
	}
	return store.OutboxLimits{MaxItems: c.Max, MaxBytes: c.Bytes, MaxStoreBytes: c.StoreBytes, TTL: ttl}
}

// RegisterFlags registers the outbox's and the push notifications'
// settings as flags of fs, each falling back to its environment variable,
// with DefaultOutboxConfig's values as defaults. Both services call it:
// an edge keeps its deliver frames with a ttl as a router keeps its
// agent's output. Validate checks what they were set to.
func (c *OutboxConfig) RegisterFlags(fs *flag.FlagSet) {
	def := DefaultOutboxConfig()
	config.Int(fs, &c.Max, "outbox-max", outboxEnv["Max"], def.Max, "frames kept per offline device; the oldest are dropped past it")
	config.Seconds(fs, &c.TTL, "outbox-ttl", outboxEnv["TTL"], def.TTL, "how long an offline device's frames are kept")
	config.MiB(fs, &c.Bytes, "outbox-mib", outboxEnv["Bytes"], def.Bytes, "bytes of frames kept per offline device; the oldest are dropped past it")
	config.MiB(fs, &c.StoreBytes, "max-outbox", outboxEnv["StoreBytes"], def.StoreBytes, "bytes of frames kept for every offline device together; the store's oldest are dropped past it")
	config.Secret(fs, &c.PushKey, "push-key", outboxEnv["PushKey"], "key of the HMAC-SHA256 signature (X-Hermes-Signature) of webhook push notifications")
	config.Seconds(fs, &c.PushEvery, "push-every", outboxEnv["PushEvery"], def.PushEvery, "at most one push notification per device per this long")
	config.Bool(fs, &c.PushContent, "push-content", outboxEnv["PushContent"], false, "put the waiting message's text in push notifications")
	config.Bool(fs, &c.PushAllowPrivate, "push-allow-private", outboxEnv["PushAllowPrivate"], false, "let push endpoints be at private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7): a self-hosted ntfy on the LAN")
	config.String(fs, &c.PushAllowNets, "push-allow-nets", outboxEnv["PushAllowNets"], "", "comma-separated networks (CIDRs) push endpoints may be in whatever they are, loopback included; cloud metadata addresses stay refused")
	c.PushServices.registerFlags(fs)
}

// outboxEnv is the environment variable of each OutboxConfig field that
// has one, so Validate's errors name what an operator sets.
var outboxEnv = map[string]string{
	"Max":              "MOBILE_OUTBOX_MAX",
	"TTL":              "MOBILE_OUTBOX_TTL",
	"Bytes":            "MOBILE_OUTBOX_MIB",
	"StoreBytes":       "MOBILE_MAX_OUTBOX_MIB",
	"PushKey":          "MOBILE_PUSH_KEY",
	"PushEvery":        "MOBILE_PUSH_EVERY",
	"PushContent":      "MOBILE_PUSH_CONTENT",
	"PushAllowPrivate": "MOBILE_PUSH_ALLOW_PRIVATE",
	"PushAllowNets":    "MOBILE_PUSH_ALLOW_NETS",
}

// Validate reports every setting that cannot work, naming it by its
// environment variable (MOBILE_OUTBOX_TTL: …); zero values stand for
// their defaults and are valid.
func (c OutboxConfig) Validate() error {
	var errs []error
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("%s: %v is negative", outboxEnv["TTL"], c.TTL))
	}
	for name, n := range map[string]int{"Max": c.Max, "Bytes": c.Bytes} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("%s: %d is negative", outboxEnv[name], n))
		}
	}
	if c.StoreBytes < 0 {
		errs = append(errs, fmt.Errorf("%s: %d is negative", outboxEnv["StoreBytes"], c.StoreBytes))
	}
	if _, err := push.ParseNets(c.PushAllowNets); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", outboxEnv["PushAllowNets"], err))
	}
	_, _, perrs := c.PushServices.load()
	errs = append(errs, perrs...)
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// The shares of the outbox's store-wide bound (store.OutboxLimits.Share):
// the credential that caused an output to be kept. Past the bound the
// share holding the most loses first (then its device holding the most),
// so the agent's answers to made-up devices cannot push out what cron's
// deliver token queued. An owner (tenant) id may take this place.
const (
	ShareAgent   = "agent"   // the outputs of an agent through the API
	ShareDeliver = "deliver" // the legacy owner's cron deliveries (Keep), and the answers to a cron socket's texts
)

// ownerSharePrefix begins the share of an owner of the tenants file.
const ownerSharePrefix = "owner:"

// OwnerShare is the one share of everything kept for the devices of owner,
// an owner of the tenants file (not the legacy owner): its answers and its
// cron's deliveries, bounded together by its outbox_mib.
func OwnerShare(owner string) string { return ownerSharePrefix + owner }

// Outbox keeps outputs for devices that hold no socket, within its
// bounds, in the store's outboxes, which a device's next connection
// reads; it wakes the device (a push notification) and has its edge read
// the outbox again. The router keeps its agent's output here, and both
// the router's API and the edge's deliver frame keep cron's deliveries
// with a ttl (Keep). One per process: the router's and the edge's, when
// both run there. Close stops its notifications.
type Outbox struct {
	cfg    OutboxConfig
	store  store.Store
	sender *Dispatcher // its Notify: the reread notice
	push   *push.Notifier
	m      *outboxMetrics
	log    *slog.Logger
}

// NewOutbox returns the Outbox of cfg on st, announcing what it keeps on
// b. cfg's errors (Validate) leave the push services off, and are logged.
func NewOutbox(cfg OutboxConfig, st store.Store, b bus.Bus, log *slog.Logger) *Outbox {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o := &Outbox{cfg: cfg, store: st, sender: &Dispatcher{Owners: st, Bus: b}, m: newOutboxMetrics(cfg.Telemetry.Meter()), log: log}
	pushNets, _ := push.ParseNets(cfg.PushAllowNets) // Validate reports an error
	fcm, apns, perrs := cfg.PushServices.load()      // and these
	if len(perrs) > 0 {
		log.Error("push services left off", "err", errors.Join(perrs...))
	}
	o.push = push.New(push.Config{Store: st, Key: []byte(cfg.PushKey), Every: cfg.PushEvery, Content: cfg.PushContent,
		FCM: fcm, APNs: apns, TTL: cfg.TTL,
		Policy:  push.Policy{AllowPrivate: cfg.PushAllowPrivate, AllowNets: pushNets},
		Backoff: cfg.PushBackoff, Log: log.With("component", "push"), Metrics: o.m})
	return o
}

// Close stops the push notifications.
func (o *Outbox) Close() { o.push.Close() }

// Notifier is the outbox's push notifier: what an app's own push token
// (the edge's push frame) and the router API's registrations are
// registered with.
func (o *Outbox) Notifier() *push.Notifier { return o.push }

// MaxTTL is the longest Keep keeps an output: OutboxConfig.TTL
// (MOBILE_OUTBOX_TTL).
func (o *Outbox) MaxTTL() time.Duration { return o.cfg.TTL }

// Keep keeps out, a delivery for device that it did not take, in the
// device's outbox for ttl (at most MaxTTL), charged to ShareDeliver (the
// owner's share for a device of a file owner), and wakes the device:
// cron's deliveries with a ttl, on the router's API and on the deliver
// frame.
func (o *Outbox) Keep(ctx context.Context, device string, out wire.Output, ttl time.Duration) error {
	share := ShareDeliver
	if owner := tenant.OwnerOf(device); owner != tenant.Legacy {
		share = OwnerShare(owner)
	}
	out.Device = device
	// The delivery's deadline may be nearly spent waiting for an ack:
	// keeping it gets time of its own, as the router's outputs do.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cfg.OpTimeout)
	defer cancel()
	if err := o.Put(kctx, device, share, out, ttl); err != nil {
		return err
	}
	o.Wake(ctx, device, out)
	return nil
}

// Put pushes the offline form of out to device's outbox for ttl (MaxTTL
// when 0), charged to share, first making the media it refers to live as
// long, and logs what the push dropped (past the store-wide bound, maybe
// other devices' items). It does not wake the device: Wake does, once.
func (o *Outbox) Put(ctx context.Context, device, share string, out wire.Output, ttl time.Duration) error {
	offline := out
	offline.Offline = true
	data, err := wire.Marshal(offline)
	if err != nil {
		return err
	}
	lim := o.cfg.Limits(ttl)
	lim.Share = share
	if owner, ok := strings.CutPrefix(share, ownerSharePrefix); ok && o.cfg.Tenants != nil {
		lim.MaxShareBytes = int64(o.cfg.Tenants.Snapshot().QuotaOf(owner).OutboxMiB) << 20
	}
	if out.Media != nil && out.Media.Blob != "" {
		if err := o.store.ExtendBlob(ctx, out.Media.Blob, lim.TTL); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	d, err := o.store.PushOutbox(ctx, device, data, lim)
	if err != nil {
		return err
	}
	if d.Share > 0 {
		if owner, ok := strings.CutPrefix(share, ownerSharePrefix); ok {
			o.cfg.Usage.Refused(owner, tenant.QuotaOutbox, int64(d.Share))
		}
	}
	if d.Total() > 0 {
		o.log.WarnContext(ctx, "outbox items dropped unwritten", "device", device, "share", share,
			"full", d.Full, "bytes", d.Bytes, "store", d.Store, "share_bound", d.Share, "expired", d.Expired,
			"max_items", lim.MaxItems, "max_bytes", lim.MaxBytes, "max_store_bytes", lim.MaxStoreBytes, "max_share_bytes", lim.MaxShareBytes)
	}
	return nil
}

// Wake counts out, just put in device's outbox, notifies the device's
// push endpoint and has the device's edge read the outbox again.
func (o *Outbox) Wake(ctx context.Context, device string, out wire.Output) {
	o.m.queued()
	o.push.Notify(device, out.Op, out.Text)
	// The device may have connected between the failed delivery and the
	// push, and read its outbox before the push: its edge reads it again.
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cfg.OpTimeout)
	defer cancel()
	if err := o.sender.Notify(nctx, wire.Control{Op: wire.OpOutbox, Device: device}); err != nil {
		o.log.DebugContext(ctx, "announcing an outbox item failed; the device reads it on its next connect", "device", device, "err", err)
	}
}
