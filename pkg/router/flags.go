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
	config.Int(fs, &c.SessionQueue, "session-queue", fieldEnv["SessionQueue"], def.SessionQueue, "events of one device waiting for the agent; past it the phone gets internal_error")
	config.Seconds(fs, &c.JournalLease, "journal-lease", fieldEnv["JournalLease"], def.JournalLease, "how long a router holds a device's events without renewing; another takes them over after it")
	config.Seconds(fs, &c.OpTimeout, "router-op-timeout", fieldEnv["OpTimeout"], def.OpTimeout, "how long one call of the router to Redis or NATS may take (an event's append to its journal, a journal's renewal, keeping an output in the outbox)")
}

// fieldEnv is the environment variable of each Config field that has one
// (BlobTTL's is the service's), so Validate's errors name what an operator
// sets.
var fieldEnv = map[string]string{
	"PromptTTL":    "MOBILE_PROMPT_TTL",
	"PromptMaxTTL": "MOBILE_PROMPT_MAX_TTL",
	"SessionQueue": "MOBILE_SESSION_QUEUE",
	"JournalLease": "MOBILE_JOURNAL_LEASE",
	"BlobTTL":      "MOBILE_BLOB_TTL",
	"OpTimeout":    "MOBILE_ROUTER_OP_TIMEOUT",
}

// setting names field in an error: its variable, or "router: <field>" for
// one set only in code.
func setting(field string) string {
	if env, ok := fieldEnv[field]; ok {
		return env
	}
	return "router: " + field
}
