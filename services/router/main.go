// Command router runs a router of a cluster: it takes the device events of
// the cluster's edges from NATS, runs the agent for them (the demo agent,
// with AGENT=openai an OpenAI-compatible chat API, or with AGENT=link an
// agent outside the gateway that reads them over HTTP),
// delivers the agent's output through the edges, expires cards, and serves
// the HTTP API of docs/api.md: deliver for cron, the agent link, /healthz
// and /readyz. It needs the cluster's NATS (NATS_URL) and Redis (REDIS_URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// flags is the command line; every flag falls back to its env var.
type flags struct {
	listen      string
	node        gateway.NodeFlags // the settings every node has
	agentTokens secret.Secret
	eventsMax   int
	router      router.Config // its tuning flags
	outbox      dispatch.OutboxConfig

	agent agent.Choice
}

func (f *flags) register(fs *flag.FlagSet) {
	config.String(fs, &f.listen, "listen", "MOBILE_ROUTER_LISTEN", "127.0.0.1:8788", "HTTP API listen address")
	f.node.RegisterFlags(fs, gateway.RouterCommand)
	config.Secret(fs, &f.agentTokens, "agent-tokens", "MOBILE_AGENT_TOKENS", "`tokens` of the agent link (sessions, events, blobs), comma-separated")
	f.agent.Register(fs, "the agent: demo, openai (an OpenAI-compatible chat API) or link (an outside agent reads GET /v1/events)")
	config.Int(fs, &f.eventsMax, "events-max", "MOBILE_EVENTS_MAX", agent.DefaultLinkMaxLen, "events the log of AGENT=link keeps (about)")
	f.router.RegisterFlags(fs)
	f.outbox.RegisterFlags(fs)
}

func main() {
	var f flags
	fs := flag.NewFlagSet("router", flag.ExitOnError)
	f.register(fs)
	version := fs.Bool("version", false, "print the version (module version, VCS revision, Go version) and exit")
	err := config.Parse(fs, os.Args[1:])
	if *version {
		fmt.Println(telemetry.VersionLine("router"))
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}

// settings is what the flags say, checked.
type settings struct {
	level     slog.Level
	agent     string // demo, openai or link
	openai    agent.OpenAIConfig
	eventsMax int
	api       router.APIConfig
	router    router.Config
	outbox    dispatch.OutboxConfig
}

func (f flags) settings() (settings, error) {
	var s settings
	var err error
	if s.level, err = f.node.Level(); err != nil {
		return s, err
	}
	if f.node.NATSURL == "" {
		return s, errors.New("NATS_URL is required: the router reaches the cluster's edges through their NATS (set NATS_URL or -nats-url)")
	}
	if f.node.RedisURL == "" {
		return s, errors.New("REDIS_URL is required: the router shares the cluster's state in its Redis (set REDIS_URL or -redis-url)")
	}
	if s.agent, s.openai, err = f.agent.Resolve(); err != nil {
		return s, err
	}
	if f.eventsMax < 1 {
		return s, fmt.Errorf("MOBILE_EVENTS_MAX: %d is not a positive number", f.eventsMax)
	}
	s.eventsMax = f.eventsMax
	if err := protocol.CheckDeviceID(f.node.HomeDevice); err != nil {
		return s, fmt.Errorf("MOBILE_HOME_DEVICE: %w", err)
	}
	s.api = router.APIConfig{
		DeliverTokens: config.List(string(f.node.DeliverTokens)),
		AgentTokens:   config.List(string(f.agentTokens)),
		HomeDevice:    f.node.HomeDevice,
	}
	s.router = f.router
	s.router.BlobTTL = f.node.BlobTTL
	s.outbox = f.outbox
	return s, errors.Join(s.router.Validate(), s.outbox.Validate())
}

// run runs the router until ctx ends, then shuts it down: the HTTP API
// (event streams end at once, other requests get 10 s), the router
// (running agent calls end), the bus and the store. The node is assembled
// by pkg/gateway, as an edge's is, without the edge.
func run(ctx context.Context, f flags, stdout, stderr io.Writer) (err error) {
	s, err := f.settings()
	if err != nil {
		return err
	}
	// Records made inside a span carry its trace_id and span_id.
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: s.level})))

	pprofOn, err := admin.PprofSetting(f.node.Pprof)
	if err != nil {
		return err
	}
	adm, err := admin.StartOps(ctx, log, f.node.AdminListen, "hermes-router")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, adm.Close()) }()
	if pprofOn {
		adm.HandlePprof()
	}
	cfg := f.node.Config()
	cfg.Name, cfg.NoEdge, cfg.Router = "hermes-router", true, true
	cfg.NewAgent = agent.Named(s.agent, s.openai, s.eventsMax)
	cfg.APIListen, cfg.API, cfg.RouterCfg, cfg.Outbox, cfg.Telemetry = f.listen, s.api, s.router, s.outbox, adm.Tel
	cfg.WaitForDeps = true
	g, err := gateway.Start(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM while waiting for Redis or NATS: nothing to drain.
			log.Info("shutting down before the dependencies were up", "err", err)
			return nil
		}
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	adm.AddCheck("store", admin.StoreCheck(g.Store))
	adm.AddCheck("bus", admin.BusCheck(g.Bus))
	if live := admin.BusLive(g.Bus); live != nil {
		adm.AddLiveCheck("bus", live)
	}
	adm.MarkReady()

	log.Info("router listening", "url", g.APIURL(), "agent", s.agent,
		"deliver_tokens", len(s.api.DeliverTokens), "agent_tokens", len(s.api.AgentTokens))
	if len(s.api.DeliverTokens)+len(s.api.AgentTokens) == 0 && cfg.TenantsFile == "" {
		log.Warn("no MOBILE_DELIVER_TOKENS and no MOBILE_AGENT_TOKENS: every endpoint but /healthz and /readyz answers 401")
	}
	<-ctx.Done()
	log.Info("shutting down")
	adm.MarkDraining()
	return nil
}
