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
	config.Seconds(fs, &c.PromptTTL, "prompt-ttl", "MOBILE_PROMPT_TTL", def.PromptTTL, "prompt card lifetime")
	config.Int(fs, &c.OutboxMax, "outbox-max", "MOBILE_OUTBOX_MAX", def.OutboxMax, "frames kept per offline device; the oldest are dropped past it")
	config.Seconds(fs, &c.OutboxTTL, "outbox-ttl", "MOBILE_OUTBOX_TTL", def.OutboxTTL, "how long an offline device's frames are kept")
	config.Int(fs, &c.SessionQueue, "session-queue", "MOBILE_SESSION_QUEUE", def.SessionQueue, "events of one device waiting for the agent; past it the phone gets internal_error")
	config.Seconds(fs, &c.JournalLease, "journal-lease", "MOBILE_JOURNAL_LEASE", def.JournalLease, "how long a router holds a device's events without renewing; another takes them over after it")
}
