// Package gateway assembles a node from its parts: the store (memory or
// Redis), the bus (embedded or external NATS), the edge and, when asked, a
// router with an agent and its HTTP API. With no URLs it is a complete
// single-node gateway. services/edge, services/router (a node without an
// edge) and the black-box tests all start nodes through it.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hermes-mobile/gateway/internal/retry"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/clock"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// Config of a node.
type Config struct {
	// Name names the node's NATS connection ("hermes-gateway").
	Name string
	// Listen is the WebSocket address (MOBILE_LISTEN, 127.0.0.1:8787).
	Listen string
	// NoEdge leaves the edge out: a router-only node (services/router).
	NoEdge bool
	// NATSURL is an external NATS (NATS_URL); empty embeds a server.
	NATSURL string
	// NATSPrefix is put in front of every NATS subject (NATS_PREFIX), so
	// several gateways can share one NATS.
	NATSPrefix string
	// RedisURL is an external Redis (REDIS_URL); empty keeps state in memory.
	RedisURL string
	// RedisMode says what RedisURL names (REDIS_MODE): single (empty),
	// cluster or sentinel; see redisstore.Options.Mode.
	RedisMode string
	// RedisPrefix starts every Redis key (REDIS_PREFIX, "hermes:").
	RedisPrefix string
	// WaitForDeps makes Start wait for an external Redis and NATS that do
	// not answer yet, retrying with backoff until they do or ctx ends, and
	// logging the failed attempts (the first at once, then one line every
	// 10 s at most); without it Start fails at once. The services set it:
	// a process started before its Redis and NATS waits for them.
	WaitForDeps bool
	// RedisPoolSize bounds the Redis client's connections (REDIS_POOL_SIZE;
	// 0: redisstore.DefaultPoolSize); a pool_size in RedisURL wins.
	RedisPoolSize int
	// MaxBlobBytes bounds the media kept for the agent, in the store
	// (MOBILE_MAX_BLOB_MIB, 1 GiB): past it a new file gets internal_error.
	MaxBlobBytes int64
	// Router runs a router in this process. Its agent is made by NewAgent
	// on the node's store (agent.Named: demo, link or openai) or, when
	// NewAgent is nil, is Agent (Demo when nil too).
	Router   bool
	NewAgent agent.Factory
	Agent    agent.Agent
	// APIListen, when set with Router, serves the router's HTTP API
	// (docs/api.md) on this address, configured by API.
	APIListen string
	API       router.APIConfig

	Edge      edge.Config
	RouterCfg router.Config
	// Outbox configures what the node keeps for a device that holds no
	// socket, and how it wakes it (MOBILE_OUTBOX_*, MOBILE_PUSH_*): the
	// one dispatch.Outbox of the process, which its router keeps the
	// agent's output in and its edge and router API keep cron's
	// deliveries with a ttl in.
	Outbox dispatch.OutboxConfig
	// Telemetry receives the node's metrics and spans (unless Edge or
	// RouterCfg name their own); nil records nothing.
	Telemetry *telemetry.Telemetry
	// TenantsFile is the tenants file (MOBILE_TENANTS_FILE): Start reads
	// it (a file that does not parse stops it), reads it again every
	// second and on SIGHUP, and hands it to the edge and the router API,
	// unless Tenants is set. Empty: the tokens of the environment are
	// the one owner.
	TenantsFile string
	// Tenants, when set, is used instead of reading TenantsFile (tests
	// drive its reloads).
	Tenants *tenant.Registry
	// Clock is the time the store and the router expire things by (unless
	// RouterCfg names its own); nil is the system clock. Tests drive it.
	Clock clock.Clock
}

// Gateway is a running node.
type Gateway struct {
	Store  store.Store
	Bus    bus.Bus
	Edge   *edge.Server   // nil with Config.NoEdge
	Router *router.Router // nil unless Config.Router
	// Outbox keeps what the node's devices did not take: the router's
	// and the edge's.
	Outbox *dispatch.Outbox
	API    *router.API // nil unless Config.Router and Config.APIListen
	// Usage counts each owner's use in this process (its edge's and its
	// router API's) and adds it to the store every second.
	Usage     *usage.Recorder
	stopUsage func() // ends Usage's flushes
	ln        net.Listener
	served    chan error

	apiSrv    *http.Server
	apiURL    string
	apiServed chan error

	stopTenants func() // ends the tenants file's reloads
}

// Start builds and starts a node. The caller must Close it.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (_ *Gateway, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	g := &Gateway{served: make(chan error, 1), stopTenants: func() {}}
	if cfg.Tenants == nil && cfg.TenantsFile != "" {
		if cfg.Tenants, err = tenant.Open(tenant.Options{Path: cfg.TenantsFile, Log: log.With("component", "tenants"),
			Meter: cfg.Telemetry.Meter()}); err != nil {
			return nil, err
		}
		tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		done := make(chan struct{})
		go func() { defer close(done); cfg.Tenants.Run(tctx, hup) }()
		g.stopTenants = func() { signal.Stop(hup); cancel(); <-done }
	}
	if cfg.Tenants != nil {
		cfg.Edge.Auth.Tenants, cfg.API.Tenants = cfg.Tenants, cfg.Tenants
	}
	if cfg.Edge.Telemetry == nil {
		cfg.Edge.Telemetry = cfg.Telemetry
	}
	if cfg.RouterCfg.Telemetry == nil {
		cfg.RouterCfg.Telemetry = cfg.Telemetry
	}
	if cfg.RouterCfg.Clock == nil {
		cfg.RouterCfg.Clock = cfg.Clock
	}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if err := g.connect(ctx, cfg, log); err != nil {
		return nil, err
	}
	if err := g.startUsage(cfg, log); err != nil {
		return nil, err
	}
	cfg.Edge.Usage, cfg.API.Usage = g.Usage, g.Usage
	g.Outbox = newOutbox(cfg, g.Store, g.Bus, g.Usage, log)
	if cfg.Router {
		if err := g.startRouter(ctx, cfg, log); err != nil {
			return nil, err
		}
	}
	if !cfg.NoEdge {
		if err := g.startEdge(ctx, cfg, log); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// check refuses a configuration that cannot work before anything is
// started, and fills in the listen address. The addresses are checked
// before the wait for Redis and NATS, so a typo is told at once.
func (cfg *Config) check() error {
	if err := errors.Join(cfg.Edge.Validate(), cfg.RouterCfg.Validate(), cfg.Outbox.Validate()); err != nil {
		return err
	}
	if cfg.NoEdge && !cfg.Router {
		return errors.New("gateway: a node with neither an edge nor a router would do nothing")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8787"
	}
	if !cfg.NoEdge {
		if err := checkAddr("MOBILE_LISTEN", cfg.Listen); err != nil {
			return err
		}
	}
	if cfg.Router && cfg.APIListen != "" {
		if err := checkAddr("MOBILE_ROUTER_LISTEN", cfg.APIListen); err != nil {
			return err
		}
	}
	switch cfg.RedisMode {
	case "", redisstore.ModeSingle, redisstore.ModeCluster, redisstore.ModeSentinel:
	default:
		return fmt.Errorf("REDIS_MODE: %q is not single, cluster or sentinel", cfg.RedisMode)
	}
	if cfg.RedisURL != "" {
		if err := redisstore.CheckURL(cfg.RedisMode, cfg.RedisURL); err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
	}
	return nil
}

// connect sets g's bus and store up: an external NATS or an embedded one,
// Redis or memory.
func (g *Gateway) connect(ctx context.Context, cfg Config, log *slog.Logger) error {
	// The bus first: with WaitForDeps it connects in the background while
	// Start waits for Redis, so the log tells of both.
	var nb *natsbus.Bus // kept out of g.Bus until it is not nil
	var err error
	if cfg.NATSURL != "" {
		nb, err = natsbus.Connect(cfg.NATSURL, natsbus.Options{Name: cfg.Name, Logger: log, SubjectPrefix: cfg.NATSPrefix, Telemetry: cfg.Telemetry,
			RetryConnect: cfg.WaitForDeps})
	} else {
		nb, err = natsbus.Embedded(natsbus.Options{Logger: log, Telemetry: cfg.Telemetry})
	}
	if err != nil {
		return fmt.Errorf("NATS_URL: %w", err)
	}
	g.Bus = nb
	if cfg.RedisURL != "" {
		rs, err := connectRedis(ctx, cfg, log)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		g.Store = rs
	} else {
		g.Store = memstore.New(memstore.Options{Clock: cfg.Clock, MaxBlobBytes: blobBytes(cfg.MaxBlobBytes)})
	}
	if err := nb.WaitConnected(ctx); err != nil {
		return fmt.Errorf("NATS_URL: %w", err)
	}
	return nil
}

// startUsage makes the process's one usage recorder, counting the
// owners of cfg.Tenants, and flushes it to the store every second until
// Close.
func (g *Gateway) startUsage(cfg Config, log *slog.Logger) error {
	u, err := usage.New(usage.Options{Tenants: cfg.Tenants, Store: g.Store, Meter: cfg.Telemetry.Meter(), Edge: !cfg.NoEdge,
		Clock: cfg.Clock, Log: log.With("component", "usage")})
	if err != nil {
		return err
	}
	g.Usage = u
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); u.Run(ctx) }()
	g.stopUsage = func() { cancel(); <-done }
	return nil
}

// newOutbox is the node's one outbox: its router keeps the agent's
// output in it, and its edge and router API cron's deliveries with a
// ttl. Its series are a router's (docs/metrics.md), which a process
// without a router does not serve: there, what it keeps is only logged.
// Its calls to the store and the bus take MOBILE_ROUTER_OP_TIMEOUT, as the
// router's do, whether or not the process runs one.
func newOutbox(cfg Config, st store.Store, b bus.Bus, u *usage.Recorder, log *slog.Logger) *dispatch.Outbox {
	ocfg := cfg.Outbox
	if cfg.Router && ocfg.Telemetry == nil {
		ocfg.Telemetry = cfg.RouterCfg.Telemetry
	}
	if ocfg.OpTimeout == 0 {
		ocfg.OpTimeout = cfg.RouterCfg.OpTimeout
	}
	if ocfg.Tenants == nil {
		ocfg.Tenants = cfg.Tenants // the owners' outbox_mib
	}
	if ocfg.Usage == nil {
		ocfg.Usage = u // what outbox_mib drops, counted as the owner's refusals
	}
	return dispatch.NewOutbox(ocfg, st, b, log.With("component", "outbox"))
}

// startRouter starts the node's router with its agent and, with
// cfg.APIListen, serves its HTTP API.
func (g *Gateway) startRouter(ctx context.Context, cfg Config, log *slog.Logger) error {
	a := cfg.Agent
	switch {
	case cfg.NewAgent != nil:
		var err error
		if a, err = cfg.NewAgent(g.Store, log, cfg.RouterCfg.Telemetry.Meter()); err != nil {
			return err
		}
	case a == nil:
		a = agent.Demo{}
	}
	if cfg.RouterCfg.Outbox == nil {
		cfg.RouterCfg.Outbox = g.Outbox
	}
	g.Router = router.New(cfg.RouterCfg, g.Store, g.Bus, a, log.With("component", "router"))
	if err := g.Router.Start(); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	if cfg.APIListen != "" {
		return g.serveAPI(ctx, cfg, log)
	}
	return nil
}

// startEdge listens on cfg.Listen and serves the node's edge there.
func (g *Gateway) startEdge(ctx context.Context, cfg Config, log *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("MOBILE_LISTEN: %w", err)
	}
	g.ln = ln
	if cfg.Edge.Outbox == nil {
		// A deliver frame with a ttl is kept as the router's API keeps
		// it, and an app's own push token registered as the API
		// registers one: by this process's outbox.
		cfg.Edge.Outbox = g.Outbox
		if cfg.Edge.Push == nil {
			cfg.Edge.Push = g.Outbox.Notifier()
		}
	}
	g.Edge = edge.New(cfg.Edge, g.Store, g.Bus, log.With("component", "edge"))
	go func() { g.served <- g.Edge.Serve(g.ln) }()
	return nil
}

// checkAddr refuses a listen address that no listen could take (no port,
// a port out of range), naming its variable; whether it is free is only
// known when listening.
func checkAddr(name, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return fmt.Errorf("%s: %q is not a host:port to listen on: %w", name, addr, err)
	}
	return nil
}

// Bounds of the wait for Redis (Config.WaitForDeps): the backoff between
// attempts and how often a failed attempt is logged.
const (
	redisRetryMin = 100 * time.Millisecond
	redisRetryMax = 5 * time.Second
	depLogEvery   = 10 * time.Second
)

// connectRedis opens the store on cfg.RedisURL; with cfg.WaitForDeps it
// retries while Redis is unavailable, until ctx ends.
func connectRedis(ctx context.Context, cfg Config, log *slog.Logger) (*redisstore.Store, error) {
	opts := redisstore.Options{URL: cfg.RedisURL, Mode: cfg.RedisMode, Prefix: cfg.RedisPrefix, PoolSize: cfg.RedisPoolSize, Clock: cfg.Clock, MaxBlobBytes: blobBytes(cfg.MaxBlobBytes), Telemetry: cfg.Telemetry}
	redisstore.SetLogger(log)
	if !cfg.WaitForDeps {
		return redisstore.New(ctx, opts)
	}
	// go-redis logs every failed dial; while waiting, the line below says
	// the same, spaced out.
	redisstore.SetLogger(slog.New(slog.DiscardHandler))
	defer redisstore.SetLogger(log)
	addr := "?"
	if u, err := url.Parse(cfg.RedisURL); err == nil {
		addr = u.Host // host:port (the first of a cluster's or the sentinels'), never the password
	}
	wait := retry.New(redisRetryMin, redisRetryMax)
	every := retry.Every{Interval: depLogEvery}
	for attempt := 1; ; attempt++ {
		rs, err := redisstore.New(ctx, opts)
		switch {
		case err == nil:
			if attempt > 1 {
				log.Info("redis connected", "addr", addr, "attempts", attempt)
			}
			return rs, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("waiting for %s: %w", addr, ctx.Err())
		case !errors.Is(err, store.ErrUnavailable):
			return nil, err // a configuration error: waiting will not mend it
		}
		if every.Allow() {
			log.Warn("redis not reachable; retrying", "addr", addr, "attempts", attempt, "err", err)
		}
		if !wait.Wait(ctx) {
			return nil, fmt.Errorf("waiting for %s: %w", addr, ctx.Err())
		}
	}
}

// serveAPI serves the router's HTTP API on cfg.APIListen.
func (g *Gateway) serveAPI(ctx context.Context, cfg Config, log *slog.Logger) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.APIListen)
	if err != nil {
		return fmt.Errorf("MOBILE_ROUTER_LISTEN: %w", err)
	}
	g.API = router.NewAPI(g.Router, cfg.API)
	g.apiSrv = g.API.Server(slog.NewLogLogger(log.With("component", "api").Handler(), slog.LevelWarn))
	g.apiURL = "http://" + ln.Addr().String()
	g.apiServed = make(chan error, 1)
	go func() { g.apiServed <- g.apiSrv.Serve(g.API.Listener(ln)) }()
	return nil
}

// APIURL is the base URL of the router's HTTP API, or "" when it is not
// served.
func (g *Gateway) APIURL() string { return g.apiURL }

// Addr is the address the edge listens on (nil without an edge).
func (g *Gateway) Addr() net.Addr {
	if g.ln == nil {
		return nil
	}
	return g.ln.Addr()
}

// URL is the WebSocket URL of the edge ("" without an edge).
func (g *Gateway) URL() string {
	if g.ln == nil {
		return ""
	}
	return "ws://" + g.ln.Addr().String() + "/ws"
}

// Close stops the node: the router's HTTP API and the edge first (sockets
// get 1001), then the router, the bus and the store.
func (g *Gateway) Close() error {
	var errs []error
	if g.stopTenants != nil {
		g.stopTenants()
		g.stopTenants = nil
	}
	if g.apiSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := g.apiSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("router API: %w", err))
			g.apiSrv.Close()
		}
		cancel()
		<-g.apiServed //nolint:errcheck // http.ErrServerClosed after Shutdown
	}
	if g.Edge != nil {
		errs = append(errs, g.Edge.Close())
		if err := <-g.served; err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	} else if g.ln != nil {
		g.ln.Close()
	}
	if g.Router != nil {
		errs = append(errs, g.Router.Close())
	}
	if g.Outbox != nil {
		g.Outbox.Close()
	}
	if g.stopUsage != nil {
		// What the edge and the router counted to the end, before the
		// store closes.
		g.stopUsage()
		g.stopUsage = nil
		// A store that is away loses that last second's counts (logged):
		// it does not hold the shutdown up past a short wait.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = g.Usage.Close(ctx)
		cancel()
	}
	if g.Bus != nil {
		errs = append(errs, g.Bus.Close())
	}
	if g.Store != nil {
		errs = append(errs, g.Store.Close())
	}
	return errors.Join(errs...)
}

// DefaultMaxBlobBytes bounds the media kept for the agent when
// Config.MaxBlobBytes is not set, in Redis as in memory.
const DefaultMaxBlobBytes = memstore.DefaultMaxBlobBytes

func blobBytes(n int64) int64 {
	if n <= 0 {
		return DefaultMaxBlobBytes
	}
	return n
}
