package router

import (
	"flag"

	"github.com/hermes-mobile/gateway/pkg/config"
)

// RegisterFlags registers the router's settings that an operator tunes as
// flags of fs, each falling back to its environment variable, with
// DefaultConfig's values as defaults. Both services call it (a node runs a
// router too); Validate checks what they were set to. BlobTTL is left to
// the caller: an edge's node shares it with the edge's.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	def := DefaultConfig()
	config.Seconds(fs, &c.PromptTTL, "prompt-ttl", fieldEnv["PromptTTL"], def.PromptTTL, "prompt card lifetime unless the agent asks for another")
	config.Seconds(fs, &c.PromptMaxTTL, "prompt-max-ttl", fieldEnv["PromptMaxTTL"], def.PromptMaxTTL, "the longest prompt card lifetime an agent may ask for (never below the prompt card lifetime)")
	config.Int(fs, &c.OutboxMax, "outbox-max", fieldEnv["OutboxMax"], def.OutboxMax, "frames kept per offline device; the oldest are dropped past it")
	config.Seconds(fs, &c.OutboxTTL, "outbox-ttl", fieldEnv["OutboxTTL"], def.OutboxTTL, "how long an offline device's frames are kept")
	config.MiB(fs, &c.OutboxBytes, "outbox-mib", fieldEnv["OutboxBytes"], def.OutboxBytes, "bytes of frames kept per offline device; the oldest are dropped past it")
	config.MiB(fs, &c.MaxOutboxBytes, "max-outbox", fieldEnv["MaxOutboxBytes"], def.MaxOutboxBytes, "bytes of frames kept for every offline device together; the store's oldest are dropped past it")
	config.Int(fs, &c.SessionQueue, "session-queue", fieldEnv["SessionQueue"], def.SessionQueue, "events of one device waiting for the agent; past it the phone gets internal_error")
	config.SecretVar(fs, &c.PushKey, "push-key", fieldEnv["PushKey"], "key of the HMAC-SHA256 signature (X-Hermes-Signature) of webhook push notifications")
	config.Seconds(fs, &c.PushEvery, "push-every", fieldEnv["PushEvery"], def.PushEvery, "at most one push notification per device per this long")
	config.Bool(fs, &c.PushContent, "push-content", fieldEnv["PushContent"], false, "put the waiting message's text in push notifications")
	config.Bool(fs, &c.PushAllowPrivate, "push-allow-private", fieldEnv["PushAllowPrivate"], false, "let push endpoints be at private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7): a self-hosted ntfy on the LAN")
	config.String(fs, &c.PushAllowNets, "push-allow-nets", fieldEnv["PushAllowNets"], "", "comma-separated networks (CIDRs) push endpoints may be in whatever they are, loopback included; cloud metadata addresses stay refused")
	c.PushServices.registerFlags(fs)
	config.Seconds(fs, &c.JournalLease, "journal-lease", fieldEnv["JournalLease"], def.JournalLease, "how long a router holds a device's events without renewing; another takes them over after it")
}

// fieldEnv is the environment variable of each Config field that has one
// (BlobTTL's is the service's), so Validate's errors name what an operator
// sets.
var fieldEnv = map[string]string{
	"PromptTTL":        "MOBILE_PROMPT_TTL",
	"PromptMaxTTL":     "MOBILE_PROMPT_MAX_TTL",
	"OutboxMax":        "MOBILE_OUTBOX_MAX",
	"OutboxTTL":        "MOBILE_OUTBOX_TTL",
	"OutboxBytes":      "MOBILE_OUTBOX_MIB",
	"MaxOutboxBytes":   "MOBILE_MAX_OUTBOX_MIB",
	"SessionQueue":     "MOBILE_SESSION_QUEUE",
	"JournalLease":     "MOBILE_JOURNAL_LEASE",
	"BlobTTL":          "MOBILE_BLOB_TTL",
	"PushKey":          "MOBILE_PUSH_KEY",
	"PushEvery":        "MOBILE_PUSH_EVERY",
	"PushContent":      "MOBILE_PUSH_CONTENT",
	"PushAllowPrivate": "MOBILE_PUSH_ALLOW_PRIVATE",
	"PushAllowNets":    "MOBILE_PUSH_ALLOW_NETS",
}

// setting names field in an error: its variable, or "router: <field>" for
// one set only in code.
func setting(field string) string {
	if env, ok := fieldEnv[field]; ok {
		return env
	}
	return "router: " + field
}
