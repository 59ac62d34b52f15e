package gateway

import (
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// NodeFlags are the settings a node has whichever command runs it: its
// NATS and Redis, the media it keeps, the deliver tokens and the home
// device, its log and its admin port. Both services register them with
// RegisterFlags, so a setting of every node is added here alone; Config
// puts the ones a node is assembled with into a Config.
type NodeFlags struct {
	NATSURL, NATSPrefix              string
	RedisURL, RedisMode, RedisPrefix string
	RedisPool                        int
	DeliverTokens                    secret.Secret
	TenantsFile                      string
	HomeDevice                       string
	LogLevel                         string
	AdminListen, Pprof               string
	MaxBlob                          int64
	BlobTTL                          time.Duration
}

// Command names the service that registers the node's flags: the names,
// the variables and the meaning are the same for both, a few defaults and
// help texts say what the setting is to that service.
type Command int

const (
	EdgeCommand   Command = iota // services/edge: an edge, or a whole single node
	RouterCommand                // services/router: a router of a cluster, without an edge
)

// commandFlags is what one service says of the node's flags.
type commandFlags struct {
	adminListen                                  string        // MOBILE_ADMIN_LISTEN's default
	blobTTL                                      time.Duration // MOBILE_BLOB_TTL's default
	natsURL, natsPrefix, redisURL, deliverTokens string        // help texts
	maxBlobUsage, blobTTLUsage                   string
}

var commands = map[Command]commandFlags{
	EdgeCommand: {
		adminListen:   "127.0.0.1:8789",
		blobTTL:       edge.DefaultConfig().BlobTTL,
		natsURL:       "external NATS; empty embeds one in the process",
		natsPrefix:    "prefix of every NATS subject, e.g. gw1. (lets several gateways share one NATS)",
		redisURL:      "external Redis; empty keeps state in memory",
		deliverTokens: "tokens allowed to send deliver frames from anywhere, comma-separated",
		maxBlobUsage:  "media kept for the agent in the store; past it a file gets internal_error",
		blobTTLUsage:  "how long media stays in the store: uploads for the agent, the agent's files for the phones",
	},
	RouterCommand: {
		adminListen:   "127.0.0.1:8790",
		blobTTL:       router.DefaultConfig().BlobTTL,
		natsURL:       "the cluster's NATS (required)",
		natsPrefix:    "prefix of every NATS subject, as the cluster's edges have it (e.g. gw1.)",
		redisURL:      "the cluster's Redis, redis://[user:pass@]host:port[/db] (required)",
		deliverTokens: "`tokens` that may call POST /v1/deliver, comma-separated",
		maxBlobUsage:  "media kept in the store for the agent and the phones (POST /v1/blobs); past it a blob is refused",
		blobTTLUsage:  "how long media sent by the agent stays in the store for the phones",
	},
}

// RegisterFlags registers the node's settings as flags of fs, each
// falling back to its environment variable, as cmd has them.
func (n *NodeFlags) RegisterFlags(fs *flag.FlagSet, cmd Command) {
	c := commands[cmd]
	config.String(fs, &n.NATSURL, "nats-url", "NATS_URL", "", c.natsURL)
	config.String(fs, &n.NATSPrefix, "nats-prefix", "NATS_PREFIX", "", c.natsPrefix)
	config.String(fs, &n.RedisURL, "redis-url", "REDIS_URL", "", c.redisURL)
	config.String(fs, &n.RedisMode, "redis-mode", "REDIS_MODE", "single", "what REDIS_URL names: single (one server), cluster (a Redis Cluster: redis://host:port?addr=host:port&addr=…) or sentinel (redis://sentinel:26379?master_name=NAME&addr=…&password=…)")
	config.String(fs, &n.RedisPrefix, "redis-prefix", "REDIS_PREFIX", "hermes:", "prefix of every Redis key")
	config.Int(fs, &n.RedisPool, "redis-pool-size", "REDIS_POOL_SIZE", redisstore.DefaultPoolSize, "most connections to Redis per process (a pool_size in REDIS_URL wins); commands wait for a free one")
	config.Secret(fs, &n.DeliverTokens, "deliver-tokens", "MOBILE_DELIVER_TOKENS", c.deliverTokens)
	config.String(fs, &n.TenantsFile, "tenants-file", "MOBILE_TENANTS_FILE", "", "the owners and their keys (docs/tenancy.md), read again within a second of a change and on SIGHUP; empty: one owner, the tokens of the environment")
	config.String(fs, &n.HomeDevice, "home-device", "MOBILE_HOME_DEVICE", "", "target of a deliver without one")
	config.String(fs, &n.LogLevel, "log-level", "MOBILE_LOG_LEVEL", "info", "debug, info, warn or error")
	config.String(fs, &n.AdminListen, "admin-listen", "MOBILE_ADMIN_LISTEN", c.adminListen, "admin HTTP address (/healthz, /readyz, /metrics); off disables it")
	config.String(fs, &n.Pprof, "pprof", "MOBILE_PPROF", "off", "on: serve the Go profiles (net/http/pprof) at /debug/pprof/ on the admin port")
	config.MiB(fs, &n.MaxBlob, "max-blob", "MOBILE_MAX_BLOB_MIB", DefaultMaxBlobBytes, c.maxBlobUsage)
	config.Seconds(fs, &n.BlobTTL, "blob-ttl", "MOBILE_BLOB_TTL", c.blobTTL, c.blobTTLUsage)
}

// Level is the log's level (MOBILE_LOG_LEVEL).
func (n NodeFlags) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(n.LogLevel)); err != nil {
		return l, fmt.Errorf("MOBILE_LOG_LEVEL: %w", err)
	}
	return l, nil
}

// Config is a node's Config with the settings it is assembled with: its
// NATS, its Redis and the media it keeps. The service adds its own.
func (n NodeFlags) Config() Config {
	return Config{NATSURL: n.NATSURL, NATSPrefix: n.NATSPrefix, RedisURL: n.RedisURL, RedisMode: n.RedisMode,
		RedisPrefix: n.RedisPrefix, RedisPoolSize: n.RedisPool, MaxBlobBytes: n.MaxBlob, TenantsFile: n.TenantsFile}
}
