// Command edge runs a gateway node. With no configuration it is a complete
// single-node gateway on ws://127.0.0.1:8787/ws: embedded NATS, in-memory
// store, a router and the demo agent.
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
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
	"github.com/hermes-mobile/gateway/pkg/web"
)

// flags is the command line; every flag falls back to its env var.
type flags struct {
	node                                       gateway.NodeFlags // the settings every node has
	token, extraTokens                         secret.Secret
	listen, allowedDevices                     string
	avatarURL, trustedProxies, forwardedHeader string
	router, webClient                          string
	drainWindow                                time.Duration
	edgeCfg                                    edge.Config   // its tuning flags
	routerCfg                                  router.Config // its tuning flags
	outbox                                     dispatch.OutboxConfig
	agent                                      agent.Choice
}

func (f *flags) register(fs *flag.FlagSet) {
	config.String(fs, &f.listen, "listen", "MOBILE_LISTEN", "127.0.0.1:8787", "WebSocket listen address")
	f.node.RegisterFlags(fs, gateway.EdgeCommand)
	config.Secret(fs, &f.token, "token", "MOBILE_TOKEN", "app token; a random one is generated and printed when empty")
	config.Secret(fs, &f.extraTokens, "extra-tokens", "MOBILE_EXTRA_TOKENS", "device-bound tokens, device_id=token,…")
	config.String(fs, &f.allowedDevices, "allowed-devices", "MOBILE_ALLOWED_DEVICES", "", "only these device ids may connect, comma-separated")
	config.String(fs, &f.avatarURL, "avatar-url", "MOBILE_AVATAR_URL", "", "avatar page URL sent in ready")
	config.String(fs, &f.trustedProxies, "trusted-proxies", "MOBILE_TRUSTED_PROXIES", "", "reverse proxies (CIDRs) whose forwarding header names the client")
	config.String(fs, &f.forwardedHeader, "forwarded-header", "MOBILE_FORWARDED_HEADER", "x-forwarded-for", "the one header read from trusted proxies: x-forwarded-for or forwarded")
	config.String(fs, &f.webClient, "web-client", "MOBILE_WEB_CLIENT", "auto", "serve the browser client at / on the WebSocket address: on, off, or auto (on without NATS_URL)")
	config.String(fs, &f.router, "router", "MOBILE_ROUTER", "auto", "run a router with AGENT here: on, off, or auto (on without NATS_URL)")
	f.agent.Register(fs, "the router's agent: demo, openai (an OpenAI-compatible chat API) or link (an outside agent over the router API)")
	config.Seconds(fs, &f.drainWindow, "drain-window", "MOBILE_DRAIN_WINDOW", 10*time.Second, "on SIGTERM, close the sockets with 1001 spread over this window")
	f.edgeCfg.RegisterFlags(fs)
	f.routerCfg.RegisterFlags(fs)
	f.outbox.RegisterFlags(fs)
}

// gcPercent is the edge's GOGC when the environment sets none. An edge's
// heap is mostly its idle sockets' state, and at Go's default of 100 its
// RSS carries about as much again of garbage and headroom: 3.6 KiB a
// phone at 19,500 against 2.6 KiB at 50 (docs/performance.md), for
// collections that idle sockets hardly cause.
const gcPercent = 50

// drainGrace is how long, past the drain window, the connections still
// closing (a frame being handled, a close handshake) may take before the
// rest are cut.
const drainGrace = 10 * time.Second

func main() {
	var f flags
	fs := flag.NewFlagSet("edge", flag.ExitOnError)
	f.register(fs)
	version := fs.Bool("version", false, "print the version (module version, VCS revision, Go version) and exit")
	err := config.Parse(fs, os.Args[1:])
	if *version {
		fmt.Println(telemetry.VersionLine("edge"))
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(2)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags, stdout, stderr io.Writer) (err error) {
	level, err := f.node.Level()
	if err != nil {
		return err
	}
	// Records made inside a span carry its trace_id and span_id.
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})))

	cfg, err := f.gatewayConfig()
	if err != nil {
		return err
	}
	// With a tenants file the owners' keys connect phones: no token is
	// made up for the legacy owner.
	generated := cfg.Edge.Auth.Token == "" && cfg.TenantsFile == ""
	if generated {
		cfg.Edge.Auth.Token = secret.Secret(ids.Hex(24))
	}
	pprofOn, err := admin.PprofSetting(f.node.Pprof)
	if err != nil {
		return err
	}
	adm, err := admin.StartOps(ctx, log, f.node.AdminListen, "hermes-edge")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, adm.Close()) }()
	if pprofOn {
		adm.HandlePprof()
	}
	cfg.Telemetry = adm.Tel
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
	if generated {
		printToken(stdout, string(cfg.Edge.Auth.Token), g.URL())
	}
	log.Info("gateway listening", "url", g.URL(), "router", cfg.Router, "nats", cfg.NATSURL != "", "redis", cfg.RedisURL != "")
	<-ctx.Done()
	drain(g, adm.Server, f.drainWindow, log)
	log.Info("shutting down")
	return nil
}

// drain takes the node out of service: /readyz fails at once, the edge
// stops accepting and closes its sockets over window. A second SIGTERM or
// SIGINT closes the rest at once.
func drain(g *gateway.Gateway, adm *admin.Server, window time.Duration, log *slog.Logger) {
	adm.MarkDraining()
	hurry, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(hurry, window+drainGrace)
	defer cancel()
	if err := g.Edge.Drain(ctx, window); err != nil {
		log.Warn("drain cut short; closing the remaining connections now", "err", err)
	}
}

func (f flags) gatewayConfig() (gateway.Config, error) {
	cfg := f.node.Config()
	cfg.Listen = f.listen
	if f.token == "" && cfg.TenantsFile == "" && (cfg.NATSURL != "" || cfg.RedisURL != "") {
		// A token made up by one process is not the others' (nor the next
		// run's): every phone would get auth_failed while each pod looks
		// healthy. Only a single zero-config node makes one up.
		return cfg, errors.New("MOBILE_TOKEN is required with NATS_URL or REDIS_URL: the nodes of a cluster must share the app token (set MOBILE_TOKEN or -token, or give the owners keys in MOBILE_TENANTS_FILE)")
	}
	var err error
	if cfg.Router, err = onOffAuto("MOBILE_ROUTER", f.router, cfg.NATSURL == ""); err != nil {
		return cfg, err
	}
	name, oc, err := f.agent.Resolve()
	if err != nil {
		return cfg, err
	}
	cfg.NewAgent = agent.Named(name, oc, 0)
	extra, err := edge.ParseExtraTokens(string(f.extraTokens))
	if err != nil {
		return cfg, err
	}
	proxies, err := edge.ParsePrefixes(f.trustedProxies)
	if err != nil {
		return cfg, err
	}
	fwdHeader, err := edge.ParseForwardedHeader(f.forwardedHeader)
	if err != nil {
		return cfg, err
	}
	auth := edge.AuthConfig{Token: secret.Secret(string(f.token)), ExtraTokens: extra, TrustedProxies: proxies, ForwardedHeader: fwdHeader}
	if auth.AllowedDevices, err = edge.ParseDevices("MOBILE_ALLOWED_DEVICES", f.allowedDevices); err != nil {
		return cfg, err
	}
	for _, t := range config.List(string(f.node.DeliverTokens)) {
		auth.DeliverTokens = append(auth.DeliverTokens, secret.Secret(t))
	}
	if _, err := edge.ParseDevices("MOBILE_HOME_DEVICE", f.node.HomeDevice); err != nil {
		return cfg, err
	}
	webClient, err := onOffAuto("MOBILE_WEB_CLIENT", f.webClient, cfg.NATSURL == "")
	if err != nil {
		return cfg, err
	}
	cfg.Edge = f.edgeCfg
	cfg.Edge.Auth, cfg.Edge.HomeDevice, cfg.Edge.AvatarURL, cfg.Edge.BlobTTL = auth, f.node.HomeDevice, f.avatarURL, f.node.BlobTTL
	cfg.Edge.Pages, cfg.Edge.AvatarPath = web.Handler(web.Options{Client: webClient}), web.AvatarPath
	cfg.RouterCfg = f.routerCfg
	cfg.RouterCfg.BlobTTL = f.node.BlobTTL
	cfg.Outbox = f.outbox
	if err := errors.Join(cfg.Edge.Validate(), cfg.RouterCfg.Validate(), cfg.Outbox.Validate()); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// onOffAuto reads an on/off/auto setting; auto is def.
func onOffAuto(name, v string, def bool) (bool, error) {
	switch strings.ToLower(v) {
	case "on", "true", "1":
		return true, nil
	case "off", "false", "0":
		return false, nil
	case "auto", "":
		return def, nil
	}
	return false, fmt.Errorf("%s: %q is not on, off or auto", name, v)
}

// printToken shows a generated token once, with a hello frame to paste.
func printToken(w io.Writer, token, url string) {
	fmt.Fprintf(w, `MOBILE_TOKEN was not set; this run's token is:

    %s

Connect to %s and send first:

    {"t":"hello","token":"%s","device":{"id":"tel-1","name":"Phone","platform":"android","app_version":"1.0.0"},"user":{"id":"u-1","name":"You"}}

`, token, url, token)
}
