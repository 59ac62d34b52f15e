package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/dispatch"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestMain runs main itself when asked to, so that the tests can check
// its exit status and output.
func TestMain(m *testing.M) {
	if os.Getenv("EDGE_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"edge"}, strings.Fields(os.Getenv("EDGE_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestVersionFlag: -version prints the build and exits 0 without starting
// a node, even with a setting that would stop it from starting.
func TestVersionFlag(t *testing.T) {
	clearEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EDGE_TEST_RUN_MAIN=1", "EDGE_TEST_ARGS=-version", "MOBILE_DRAIN_WINDOW=soon")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("edge -version: %v, output %q", err, out)
	}
	if !strings.HasPrefix(string(out), "edge ") || !strings.Contains(string(out), " revision ") || !strings.Contains(string(out), runtime.Version()) {
		t.Errorf("edge -version printed %q, want the command, its revision and %s", out, runtime.Version())
	}
	if strings.Contains(string(out), "listening") || strings.Count(string(out), "\n") != 1 {
		t.Errorf("edge -version printed more than its version: %q", out)
	}
}

// clearEnv unsets every variable the command reads, for the test.
func clearEnv(t *testing.T) {
	var f flags
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	f.register(fs)
	testsvc.ClearEnv(t, fs, "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME")
}

// parse registers the flags on a new FlagSet (reading the environment as it
// is now) and parses args.
func parse(t *testing.T, args ...string) (flags, error) {
	t.Helper()
	var f flags
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.register(fs)
	err := config.Parse(fs, args)
	return f, err
}

func mustParse(t *testing.T, args ...string) flags {
	t.Helper()
	f, err := parse(t, args...)
	if err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return f
}

func TestFlagDefaults(t *testing.T) {
	clearEnv(t)
	f := mustParse(t)
	want := flags{listen: "127.0.0.1:8787", router: "auto", webClient: "auto", forwardedHeader: "x-forwarded-for", drainWindow: 10 * time.Second,
		edgeCfg: edge.Config{PingInterval: 30 * time.Second,
			MaxReadBytes: 256 << 20, MaxQueuedBytes: 256 << 20, MaxUploadBytes: 256 << 20,
			MaxHelloBytes: 16 << 20, MaxHelloConns: 10_000, MaxHelloConnsPerAddr: 256, HelloPrefixV4: 32, HelloPrefixV6: 64,
			MaxOutboundBytes: 32 << 20, WriteTimeout: 10 * time.Second, ReadTimeout: time.Minute, OwnerTTL: 30 * time.Second,
			AckWait: 10 * time.Second, PageTimeout: 10 * time.Second, MaxPageConns: 1024},
		routerCfg: router.Config{PromptTTL: protocol.DefaultPromptTTL, PromptMaxTTL: router.DefaultPromptMaxTTL, SessionQueue: 1000, JournalLease: 15 * time.Second, OpTimeout: 5 * time.Second},
		outbox:    dispatch.OutboxConfig{Max: 1024, TTL: 24 * time.Hour, Bytes: 32 << 20, StoreBytes: 1 << 30, PushEvery: 15 * time.Minute},
		agent:     agent.Choice{Name: "demo", OpenAIBaseURL: "https://api.openai.com/v1", OpenAITimeout: 120 * time.Second},
		node:      gateway.NodeFlags{RedisMode: "single", LogLevel: "info", RedisPrefix: "hermes:", RedisPool: 32, AdminListen: "127.0.0.1:8789", Pprof: "off", MaxBlob: 1 << 30, BlobTTL: 15 * time.Minute},
	}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("defaults = %+v, want %+v", f, want)
	}
	if protocol.DefaultPromptTTL != 300*time.Second {
		t.Fatalf("DefaultPromptTTL = %v, the spec says 300 s", protocol.DefaultPromptTTL)
	}
}

func TestEnvAndFlags(t *testing.T) {
	for _, tc := range []struct {
		env, flag       string
		envVal, flagVal string
		field           func(flags) string
	}{
		{"MOBILE_TOKEN", "token", "env-token", "flag-token", func(f flags) string { return string(f.token) }},
		{"MOBILE_EXTRA_TOKENS", "extra-tokens", "tel-1=a", "tel-2=b", func(f flags) string { return string(f.extraTokens) }},
		{"MOBILE_ALLOWED_DEVICES", "allowed-devices", "tel-1,tel-2", "tel-3", func(f flags) string { return f.allowedDevices }},
		{"MOBILE_DELIVER_TOKENS", "deliver-tokens", "d1,d2", "d3", func(f flags) string { return string(f.node.DeliverTokens) }},
		{"MOBILE_HOME_DEVICE", "home-device", "tel-home", "tel-other", func(f flags) string { return f.node.HomeDevice }},
		{"MOBILE_LISTEN", "listen", "0.0.0.0:9000", "127.0.0.1:9001", func(f flags) string { return f.listen }},
		{"MOBILE_AVATAR_URL", "avatar-url", "https://env.example/avatar/", "https://flag.example/a/", func(f flags) string { return f.avatarURL }},
		{"MOBILE_TRUSTED_PROXIES", "trusted-proxies", "10.0.0.0/8", "127.0.0.1", func(f flags) string { return f.trustedProxies }},
		{"NATS_URL", "nats-url", "nats://env:4222", "nats://flag:4222", func(f flags) string { return f.node.NATSURL }},
		{"REDIS_URL", "redis-url", "redis://env:6379", "redis://flag:6379", func(f flags) string { return f.node.RedisURL }},
		{"MOBILE_ROUTER", "router", "off", "on", func(f flags) string { return f.router }},
		{"MOBILE_LOG_LEVEL", "log-level", "debug", "warn", func(f flags) string { return f.node.LogLevel }},
		{"AGENT", "agent", "openai", "link", func(f flags) string { return f.agent.Name }},
		{"OPENAI_BASE_URL", "openai-base-url", "http://env:11434/v1", "http://flag:8000/v1", func(f flags) string { return f.agent.OpenAIBaseURL }},
		{"OPENAI_API_KEY", "openai-api-key", "sk-env", "sk-flag", func(f flags) string { return string(f.agent.OpenAIKey) }},
		{"OPENAI_MODEL", "openai-model", "llama3", "gpt-4o-mini", func(f flags) string { return f.agent.OpenAIModel }},
		{"OPENAI_SYSTEM_PROMPT", "openai-system-prompt", "Be brief.", "Be kind.", func(f flags) string { return f.agent.OpenAIPrompt }},
		{"MOBILE_PROMPT_TTL", "prompt-ttl", "45", "90", func(f flags) string { return f.routerCfg.PromptTTL.String() }},
		{"MOBILE_ADMIN_LISTEN", "admin-listen", "off", "127.0.0.1:9002", func(f flags) string { return f.node.AdminListen }},
		{"MOBILE_PPROF", "pprof", "on", "off", func(f flags) string { return f.node.Pprof }},
		{"MOBILE_DRAIN_WINDOW", "drain-window", "45", "90", func(f flags) string { return f.drainWindow.String() }},
		{"MOBILE_PING_INTERVAL", "ping-interval", "45", "90", func(f flags) string { return f.edgeCfg.PingInterval.String() }},
		{"MOBILE_MAX_READ_MIB", "max-read", "45", "90", func(f flags) string { return mib(f.edgeCfg.MaxReadBytes) }},
		{"MOBILE_MAX_QUEUED_MIB", "max-queued", "45", "90", func(f flags) string { return mib(f.edgeCfg.MaxQueuedBytes) }},
		{"MOBILE_MAX_UPLOAD_MIB", "max-upload", "45", "90", func(f flags) string { return mib(f.edgeCfg.MaxUploadBytes) }},
		{"MOBILE_MAX_BLOB_MIB", "max-blob", "45", "90", func(f flags) string { return mib(f.node.MaxBlob) }},
		{"MOBILE_MAX_OUTBOUND_MIB", "max-outbound", "45", "90", func(f flags) string { return mib(int64(f.edgeCfg.MaxOutboundBytes)) }},
		{"MOBILE_WRITE_TIMEOUT", "write-timeout", "45", "90", func(f flags) string { return f.edgeCfg.WriteTimeout.String() }},
		{"MOBILE_READ_TIMEOUT", "read-timeout", "45", "90", func(f flags) string { return f.edgeCfg.ReadTimeout.String() }},
		{"MOBILE_OWNER_TTL", "owner-ttl", "45", "90", func(f flags) string { return f.edgeCfg.OwnerTTL.String() }},
		{"MOBILE_ACK_WAIT", "ack-wait", "45", "90", func(f flags) string { return f.edgeCfg.AckWait.String() }},
		{"MOBILE_PAGE_TIMEOUT", "page-timeout", "45", "90", func(f flags) string { return f.edgeCfg.PageTimeout.String() }},
		{"MOBILE_MAX_PAGE_CONNS", "max-page-conns", "45", "90", func(f flags) string { return strconv.Itoa(f.edgeCfg.MaxPageConns) }},
		{"MOBILE_BLOB_TTL", "blob-ttl", "45", "90", func(f flags) string { return f.node.BlobTTL.String() }},
		{"MOBILE_OUTBOX_MAX", "outbox-max", "45", "90", func(f flags) string { return strconv.Itoa(f.outbox.Max) }},
		{"MOBILE_OUTBOX_TTL", "outbox-ttl", "45", "90", func(f flags) string { return f.outbox.TTL.String() }},
		{"MOBILE_OUTBOX_MIB", "outbox-mib", "45", "90", func(f flags) string { return mib(int64(f.outbox.Bytes)) }},
		{"MOBILE_MAX_OUTBOX_MIB", "max-outbox", "45", "90", func(f flags) string { return mib(f.outbox.StoreBytes) }},
		{"MOBILE_SESSION_QUEUE", "session-queue", "45", "90", func(f flags) string { return strconv.Itoa(f.routerCfg.SessionQueue) }},
		{"MOBILE_JOURNAL_LEASE", "journal-lease", "45", "90", func(f flags) string { return f.routerCfg.JournalLease.String() }},
		{"MOBILE_ROUTER_OP_TIMEOUT", "router-op-timeout", "45", "90", func(f flags) string { return f.routerCfg.OpTimeout.String() }},
	} {
		t.Run(tc.env, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.env, tc.envVal)
			want := tc.envVal
			if seconds(tc.flag) {
				want = "45s" // seconds
			}
			if got := tc.field(mustParse(t)); got != want {
				t.Fatalf("$%s=%q → %q, want %q", tc.env, tc.envVal, got, want)
			}
			want = tc.flagVal
			if seconds(tc.flag) {
				want = "1m30s"
			}
			if got := tc.field(mustParse(t, "-"+tc.flag+"="+tc.flagVal)); got != want {
				t.Fatalf("-%s=%q with $%s=%q → %q, want the flag's %q", tc.flag, tc.flagVal, tc.env, tc.envVal, got, want)
			}
		})
	}
}

func TestPromptTTLValues(t *testing.T) {
	clearEnv(t)
	for in, want := range map[string]time.Duration{"45": 45 * time.Second, "1": time.Second, "90s": 90 * time.Second, "5m": 5 * time.Minute} {
		t.Setenv("MOBILE_PROMPT_TTL", in)
		if got := mustParse(t).routerCfg.PromptTTL; got != want {
			t.Errorf("$MOBILE_PROMPT_TTL=%q → %v, want %v", in, got, want)
		}
		os.Unsetenv("MOBILE_PROMPT_TTL")
		if got := mustParse(t, "-prompt-ttl", in).routerCfg.PromptTTL; got != want {
			t.Errorf("-prompt-ttl %q → %v, want %v", in, got, want)
		}
	}
	for _, bad := range []string{"0", "-5", "abc", "0s", "1.5"} {
		if _, err := parse(t, "-prompt-ttl="+bad); err == nil {
			t.Errorf("-prompt-ttl=%q accepted", bad)
		}
	}
}

func TestGatewayConfigFromEnv(t *testing.T) {
	clearEnv(t)
	for k, v := range map[string]string{
		"MOBILE_TOKEN":           "app-token",
		"MOBILE_EXTRA_TOKENS":    "tel-1=bound-1, tel-2=bound-2",
		"MOBILE_ALLOWED_DEVICES": " tel-1 ,tel-2,,",
		"MOBILE_DELIVER_TOKENS":  "cron-1, cron-2",
		"MOBILE_HOME_DEVICE":     "tel-1",
		"MOBILE_PROMPT_TTL":      "45",
		"MOBILE_LISTEN":          "127.0.0.1:9999",
		"MOBILE_AVATAR_URL":      "https://agent.example.com/avatar/",
		"MOBILE_TRUSTED_PROXIES": "10.0.0.0/8, 127.0.0.1",
		"NATS_URL":               "nats://nats.example:4222",
		"REDIS_URL":              "redis://redis.example:6379",
	} {
		t.Setenv(k, v)
	}
	cfg, err := mustParse(t).gatewayConfig()
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Edge.Auth
	checks := []struct {
		name      string
		got, want any
	}{
		{"Listen", cfg.Listen, "127.0.0.1:9999"},
		{"NATSURL", cfg.NATSURL, "nats://nats.example:4222"},
		{"RedisURL", cfg.RedisURL, "redis://redis.example:6379"},
		{"Router (auto with NATS_URL)", cfg.Router, false},
		{"Token", a.Token, secret.Secret("app-token")},
		{"ExtraTokens", a.ExtraTokens, map[string]secret.Secret{"tel-1": "bound-1", "tel-2": "bound-2"}},
		{"AllowedDevices", a.AllowedDevices, []string{"tel-1", "tel-2"}},
		{"DeliverTokens", a.DeliverTokens, []secret.Secret{"cron-1", "cron-2"}},
		{"TrustedProxies", a.TrustedProxies, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32")}},
		{"HomeDevice", cfg.Edge.HomeDevice, "tel-1"},
		{"AvatarURL", cfg.Edge.AvatarURL, "https://agent.example.com/avatar/"},
		{"PromptTTL", cfg.RouterCfg.PromptTTL, 45 * time.Second},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestRouterModes(t *testing.T) {
	for _, tc := range []struct {
		router, nats string
		want         bool
	}{
		{"on", "", true}, {"ON", "nats://x:4222", true}, {"true", "", true}, {"1", "nats://x:4222", true},
		{"off", "", false}, {"Off", "", false}, {"false", "", false}, {"0", "", false},
		{"auto", "", true}, {"auto", "nats://x:4222", false}, {"", "", true}, {"", "nats://x:4222", false},
	} {
		f := flags{router: tc.router, token: "x", node: gateway.NodeFlags{NATSURL: tc.nats}}
		cfg, err := f.gatewayConfig()
		if err != nil || cfg.Router != tc.want {
			t.Errorf("router %q nats %q → %v, %v; want %v", tc.router, tc.nats, cfg.Router, err, tc.want)
		}
	}
}

func TestGatewayConfigErrors(t *testing.T) {
	for _, tc := range []struct{ env, val string }{
		{"MOBILE_EXTRA_TOKENS", "tel-1"},
		{"MOBILE_EXTRA_TOKENS", "tel-1=a,=b"},
		{"MOBILE_EXTRA_TOKENS", "tel-1="},
		{"MOBILE_TRUSTED_PROXIES", "not-an-address"},
		{"MOBILE_TRUSTED_PROXIES", "10.0.0.0/40"},
		{"MOBILE_ROUTER", "maybe"},
		{"MOBILE_FORWARDED_HEADER", "x-real-ip"},
	} {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.env, tc.val)
			_, err := mustParse(t).gatewayConfig()
			if err == nil {
				t.Fatalf("$%s=%q accepted", tc.env, tc.val)
			}
			if !strings.Contains(err.Error(), tc.env) {
				t.Fatalf("error %q does not name $%s", err, tc.env)
			}
		})
	}
}

// TestConfiguredDeviceIDBound: a configured device id of exactly 120
// characters (the longest a hello keeps) is accepted; one of 121, which no
// device can have, is refused at start with an error naming the variable.
func TestConfiguredDeviceIDBound(t *testing.T) {
	at := strings.Repeat("é", protocol.MaxDeviceFieldChars)
	over := at + "x"
	for _, tc := range []struct{ env, at, over string }{
		{"MOBILE_EXTRA_TOKENS", "tel-1=a," + at + "=b", "tel-1=a," + over + "=b"},
		{"MOBILE_ALLOWED_DEVICES", "tel-1," + at, "tel-1," + over},
		{"MOBILE_HOME_DEVICE", at, over},
	} {
		t.Run(tc.env, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.env, tc.at)
			cfg, err := mustParse(t).gatewayConfig()
			if err != nil {
				t.Fatalf("120 characters: %v", err)
			}
			a := cfg.Edge.Auth
			if _, bound := a.ExtraTokens[at]; !bound && !slices.Contains(a.AllowedDevices, at) && cfg.Edge.HomeDevice != at {
				t.Fatalf("the 120-character id is not in the configuration: %+v", cfg.Edge)
			}
			t.Setenv(tc.env, tc.over)
			_, err = mustParse(t).gatewayConfig()
			if err == nil || !strings.Contains(err.Error(), tc.env) {
				t.Fatalf("121 characters: %v, want an error naming %s", err, tc.env)
			}
			if strings.Contains(err.Error(), "=b") {
				t.Fatalf("the error shows a token: %v", err)
			}
		})
	}
}

// TestClusterNeedsToken: with NATS_URL or REDIS_URL (a cluster, or state
// that outlives the process) an edge without MOBILE_TOKEN refuses to start,
// naming the variable; the zero-config single node still makes one up.
func TestClusterNeedsToken(t *testing.T) {
	for _, env := range [][]string{
		{"NATS_URL", "nats://127.0.0.1:4222", "REDIS_URL", "redis://127.0.0.1:6379"},
		{"NATS_URL", "nats://127.0.0.1:4222"},
		{"REDIS_URL", "redis://127.0.0.1:6379"},
	} {
		t.Run(strings.Join(env, " "), func(t *testing.T) {
			clearEnv(t)
			for i := 0; i < len(env); i += 2 {
				t.Setenv(env[i], env[i+1])
			}
			_, err := mustParse(t).gatewayConfig()
			if err == nil || !strings.Contains(err.Error(), "MOBILE_TOKEN") {
				t.Fatalf("gatewayConfig = %v, want an error naming MOBILE_TOKEN", err)
			}
			t.Setenv("MOBILE_TOKEN", "shared")
			if _, err := mustParse(t).gatewayConfig(); err != nil {
				t.Fatalf("with MOBILE_TOKEN: %v", err)
			}
		})
	}
	clearEnv(t)
	if _, err := mustParse(t).gatewayConfig(); err != nil {
		t.Fatalf("zero-config single node: %v", err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    flags
		want string
	}{
		{"log level", flags{listen: "127.0.0.1:0", router: "auto", token: "x", node: gateway.NodeFlags{LogLevel: "loud"}}, "MOBILE_LOG_LEVEL"},
		{"router", flags{listen: "127.0.0.1:0", router: "maybe", token: "x", node: gateway.NodeFlags{LogLevel: "info"}}, "MOBILE_ROUTER"},
		// A Redis or NATS that does not answer is waited for (see
		// test/cluster's TestStartBeforeRedisAndNATS); a URL that cannot
		// work is refused.
		{"redis", flags{listen: "127.0.0.1:0", router: "auto", token: "x", node: gateway.NodeFlags{LogLevel: "info", RedisURL: "http://127.0.0.1:1"}}, "REDIS_URL"},
		{"nats", flags{listen: "127.0.0.1:0", router: "auto", token: "x", node: gateway.NodeFlags{LogLevel: "info", NATSURL: "nats://127.0.0.1:port", AdminListen: "off"}}, "NATS_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stdout, stderr bytes.Buffer
			err := func() (err error) {
				// A panic here is a failure of this case, not of the binary.
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("run panicked instead of returning an error: %v", r)
					}
				}()
				return run(ctx, tc.f, &stdout, &stderr)
			}()
			if t.Failed() {
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// runNode runs run(f) in the background and returns the WebSocket URL from
// the "gateway listening" log line, the captured stdout, and a function that
// cancels run and returns its result.
func runNode(t *testing.T, f flags) (url string, stdout *testsvc.Buffer, stop func() error) {
	t.Helper()
	url, stdout, _, stop = testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, f, stdout, stderr)
	})
	return url, stdout, stop
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRunPrintsGeneratedToken(t *testing.T) {
	clearEnv(t) // MOBILE_TOKEN unset
	f := mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-drain-window=200ms")
	url, stdout, stop := runNode(t, f)
	if !strings.HasPrefix(url, "ws://127.0.0.1:") || !strings.HasSuffix(url, "/ws") || strings.HasSuffix(url, ":0/ws") {
		t.Fatalf("listening url = %q, want ws://127.0.0.1:<port>/ws", url)
	}

	// The token, on its own line after the announcement, and the hello frame.
	out := stdout.String()
	var token, hello string
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if strings.Contains(line, "token is:") {
			for _, next := range lines[i+1:] {
				if next = strings.TrimSpace(next); next != "" {
					token = next
					break
				}
			}
		}
		if strings.HasPrefix(line, "{") {
			hello = line
		}
	}
	if len(token) != 48 {
		t.Fatalf("no 48-character token in stdout:\n%s", out)
	}
	if _, err := hex.DecodeString(token); err != nil {
		t.Fatalf("token %q is not hex: %v", token, err)
	}
	var h struct {
		T, Token string
		Device   struct{ ID string }
	}
	if err := json.Unmarshal([]byte(hello), &h); err != nil {
		t.Fatalf("the printed hello frame %q is not JSON: %v\nstdout:\n%s", hello, err, out)
	}
	if h.T != "hello" || h.Token != token || h.Device.ID == "" {
		t.Fatalf("printed hello frame %q: want t hello, the printed token and a device id", hello)
	}

	// The frame works verbatim.
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.SendRaw([]byte(hello)); err != nil {
		t.Fatal(err)
	}
	ready, err := c.Expect(testCtx(t), protocol.TypeReady)
	if err != nil {
		t.Fatal(err)
	}
	if got := ready.Str("session"); got != protocol.SessionPrefix+h.Device.ID {
		t.Fatalf("session = %q, want mobile:%s", got, h.Device.ID)
	}
	// With no NATS_URL the node runs the demo agent: a text is answered.
	if err := c.Text("m-1", "ping the demo"); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Str("id") == "" {
		t.Fatalf("message without id: %s", msg)
	}

	// A wrong token is refused: the printed one is the only one.
	bad, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.CloseNow()
	_, err = bad.Hello(testCtx(t), token+"x", protocol.Device{ID: "tel-2"}, protocol.User{})
	if se, ok := err.(*client.ServerError); !ok || se.Code != protocol.CodeAuthFailed {
		t.Fatalf("hello with a wrong token = %v, want auth_failed", err)
	}

	// Cancelling the context shuts the node down: the socket gets 1001 and
	// run returns nil.
	done := make(chan error, 1)
	go func() { done <- stop() }()
	ci, err := c.ExpectClose(testCtx(t))
	if err != nil {
		t.Fatalf("waiting for the shutdown close: %v", err)
	}
	if ci.Code != 1001 {
		t.Fatalf("shutdown close code = %d, want 1001 (going away)", ci.Code)
	}
	if err := <-done; err != nil {
		t.Fatalf("run returned %v after cancel, want nil", err)
	}
}

func TestRunWithTokenPrintsNothing(t *testing.T) {
	clearEnv(t)
	t.Setenv("MOBILE_TOKEN", "my-token")
	url, stdout, stop := runNode(t, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-drain-window=200ms"))
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, err := c.Hello(testCtx(t), "my-token", protocol.Device{ID: "tel-1"}, protocol.User{}); err != nil {
		t.Fatal(err)
	}
	if out := stdout.String(); out != "" {
		t.Fatalf("stdout with MOBILE_TOKEN set = %q, want nothing", out)
	}
	done := make(chan error, 1)
	go func() { done <- stop() }()
	if _, err := c.ExpectClose(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run = %v, want nil", err)
	}
}

// TestHelpHidesTokens: -help shows the flags' values; once the tokens came
// from the environment they must not be among them.
func TestHelpHidesTokens(t *testing.T) {
	t.Setenv("MOBILE_TOKEN", "app-secret-123")
	t.Setenv("MOBILE_EXTRA_TOKENS", "tel-1=bound-secret-456")
	t.Setenv("MOBILE_DELIVER_TOKENS", "cron-secret-789")
	t.Setenv("OPENAI_API_KEY", "sk-secret-000")
	var f flags
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	f.register(fs)
	if err := config.Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	fs.PrintDefaults()
	if err := config.Parse(fs, []string{"-help"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-help: %v", err)
	}
	for _, s := range []string{"app-secret-123", "bound-secret-456", "cron-secret-789", "sk-secret-000"} {
		if strings.Contains(out.String(), s) {
			t.Errorf("-help shows the token %q:\n%s", s, out.String())
		}
	}
	if string(f.token) != "app-secret-123" {
		t.Errorf("token from the environment = %q", f.token)
	}
}

// adminGet fetches url and decodes its JSON body; code 0 means no answer.
func adminGet(url string) (code int, body map[string]any) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// TestAdminAndDrain: the admin port answers /healthz and /readyz; on
// shutdown /readyz turns 503 at once, the sockets get 1001 spread over
// MOBILE_DRAIN_WINDOW, run returns nil and the admin port closes.
func TestAdminAndDrain(t *testing.T) {
	clearEnv(t)
	const window = time.Second
	f := mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-drain-window=1", "-token=tok")
	url, _, stderr, stop := testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, f, stdout, stderr)
	})
	admin := testsvc.ListeningURL(t, stderr.String(), "admin listening")
	if !strings.HasPrefix(admin, "http://127.0.0.1:") {
		t.Fatalf("admin listening url = %q", admin)
	}
	if code, body := adminGet(admin + "/healthz"); code != 200 || body["ok"] != true {
		t.Fatalf("/healthz: %d %v", code, body)
	}
	code, body := adminGet(admin + "/readyz")
	checks, _ := body["checks"].(map[string]any)
	if code != 200 || body["state"] != "ready" || checks["store"] != "ok" || checks["bus"] != "ok" {
		t.Fatalf("/readyz of a running node: %d %v, want 200 ready with store and bus ok", code, body)
	}

	const phones = 6
	conns := make([]*client.Conn, phones)
	for i := range conns {
		c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		if _, err := c.Hello(testCtx(t), "tok", protocol.Device{ID: fmt.Sprintf("tel-%d", i)}, protocol.User{}); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}

	begin := time.Now()
	done := make(chan error, 1)
	go func() { done <- stop() }()
	for {
		code, body := adminGet(admin + "/readyz")
		if code == 503 && body["state"] == "draining" {
			break
		}
		if time.Since(begin) > window/4 {
			t.Fatalf("/readyz %v after shutdown began: %d %v, want 503 draining", time.Since(begin), code, body)
		}
		time.Sleep(5 * time.Millisecond) // poll interval: the loop waits for its condition
	}
	// Each phone's close is timed as it comes: the edge closes them in no
	// particular order, so waiting for one after the other would time the
	// later ones by the slowest before them.
	type closed struct {
		at   time.Duration
		code int
		err  error
	}
	got := make(chan closed, phones)
	for _, c := range conns {
		go func() {
			ci, err := c.ExpectClose(testCtx(t))
			if err != nil {
				got <- closed{err: err}
				return
			}
			got <- closed{at: time.Since(begin), code: ci.Code}
		}()
	}
	var first, last time.Duration
	for i := range phones {
		cl := <-got
		if cl.err != nil {
			t.Fatalf("phone: %v", cl.err)
		}
		if cl.code != 1001 {
			t.Fatalf("phone: close %d, want 1001", cl.code)
		}
		if i == 0 || cl.at < first {
			first = cl.at
		}
		last = max(last, cl.at)
	}
	if last-first < window/3 {
		t.Fatalf("closes between %v and %v: not spread over the %v window", first, last, window)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v after shutdown, want nil", err)
		}
	case <-time.After(window + 5*time.Second):
		t.Fatal("run did not return 5 s after the drain window")
	}
	if code, _ := adminGet(admin + "/healthz"); code != 0 {
		t.Fatalf("the admin port still answers (%d) after run returned", code)
	}
}

func TestAdminOffAndBusy(t *testing.T) {
	clearEnv(t)
	_, _, stderr, stop := testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
		return run(ctx, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-token=tok"), stdout, stderr)
	})
	stop()
	if strings.Contains(stderr.String(), "admin listening") {
		t.Fatalf("MOBILE_ADMIN_LISTEN=off still serves:\n%s", stderr)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out bytes.Buffer
	err = run(testCtx(t), mustParse(t, "-listen=127.0.0.1:0", "-admin-listen="+ln.Addr().String(), "-token=tok"), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "MOBILE_ADMIN_LISTEN") {
		t.Fatalf("run with the admin port taken = %v, want an error naming MOBILE_ADMIN_LISTEN", err)
	}
}

// TestAgentChoice: AGENT picks the router's agent; an unknown AGENT, and
// AGENT=openai without OPENAI_MODEL or with a bad OPENAI_BASE_URL, refuse
// to start with an error naming the variable.
func TestAgentChoice(t *testing.T) {
	for _, tc := range []struct {
		env        map[string]string
		link, oai  bool
		wantErrVar string
	}{
		{env: map[string]string{}},
		{env: map[string]string{"AGENT": "demo"}},
		{env: map[string]string{"AGENT": "Link"}, link: true},
		{env: map[string]string{"AGENT": "openai", "OPENAI_MODEL": "llama3"}, oai: true},
		{env: map[string]string{"AGENT": "smart"}, wantErrVar: "AGENT"},
		{env: map[string]string{"AGENT": "openai"}, wantErrVar: "OPENAI_MODEL"},
		{env: map[string]string{"AGENT": "openai", "OPENAI_MODEL": " "}, wantErrVar: "OPENAI_MODEL"},
		{env: map[string]string{"AGENT": "openai", "OPENAI_MODEL": "m", "OPENAI_BASE_URL": "localhost:11434"}, wantErrVar: "OPENAI_BASE_URL"},
	} {
		clearEnv(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		cfg, err := mustParse(t).gatewayConfig()
		if tc.wantErrVar != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrVar) {
				t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.wantErrVar)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.env, err)
			continue
		}
		a, err := cfg.NewAgent(memstore.New(memstore.Options{}), slog.New(slog.DiscardHandler), nil)
		_, link := a.(*agent.Link)
		_, oai := a.(*agent.OpenAI)
		if err != nil || link != tc.link || oai != tc.oai {
			t.Errorf("%v: agent %T, %v; want link %v, openai %v", tc.env, a, err, tc.link, tc.oai)
		}
	}
	clearEnv(t)
	for k, v := range map[string]string{"AGENT": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1", "OPENAI_API_KEY": "sk-1",
		"OPENAI_MODEL": "llama3", "OPENAI_SYSTEM_PROMPT": "Be brief.", "OPENAI_TIMEOUT": "30"} {
		t.Setenv(k, v)
	}
	name, oc, err := mustParse(t).agent.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := agent.OpenAIConfig{BaseURL: "http://127.0.0.1:11434/v1", APIKey: "sk-1", Model: "llama3", SystemPrompt: "Be brief.", Timeout: 30 * time.Second}
	if name != "openai" || oc != want {
		t.Errorf("agent %q with %+v, want openai with %+v", name, oc, want)
	}
}

// TestRunOpenAI: the command with AGENT=openai answers a phone from an
// OpenAI-compatible server.
func TestRunOpenAI(t *testing.T) {
	var got struct {
		Model    string `json:"model"`
		Messages []struct{ Role, Content string }
	}
	llm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer sk-run" {
			http.Error(w, "wrong request", 400)
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi \"}}]}\n\n"+
			"data: {\"choices\":[{\"delta\":{\"content\":\"there\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer llm.Close()
	clearEnv(t)
	t.Setenv("MOBILE_TOKEN", "my-token")
	t.Setenv("OPENAI_API_KEY", "sk-run")
	url, _, _ := runNode(t, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-drain-window=200ms",
		"-agent=openai", "-openai-base-url="+llm.URL+"/v1", "-openai-model=tiny", "-openai-system-prompt=Be brief."))
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, err := c.Hello(testCtx(t), "my-token", protocol.Device{ID: "tel-1"}, protocol.User{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Text("m-1", "hello"); err != nil {
		t.Fatal(err)
	}
	msg, err := c.Expect(testCtx(t), protocol.TypeMessage)
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := c.CollectMessage(testCtx(t), msg.Str("id"))
	if err != nil || text != "Hi there" {
		t.Fatalf("answer %q, %v; want \"Hi there\"", text, err)
	}
	if got.Model != "tiny" || len(got.Messages) != 2 || got.Messages[0].Content != "Be brief." || got.Messages[1].Content != "hello" {
		t.Fatalf("upstream request %+v", got)
	}
}

// TestWebClientModes: the browser client is served on the zero-config single
// node (auto without NATS_URL) and not in a cluster; the avatar page always.
func TestWebClientModes(t *testing.T) {
	for _, tc := range []struct {
		web, nats string
		want      bool
	}{
		{"on", "", true}, {"on", "nats://x:4222", true}, {"off", "", false}, {"OFF", "nats://x:4222", false},
		{"auto", "", true}, {"auto", "nats://x:4222", false}, {"", "", true}, {"", "nats://x:4222", false},
	} {
		f := flags{webClient: tc.web, token: "x", node: gateway.NodeFlags{NATSURL: tc.nats}}
		cfg, err := f.gatewayConfig()
		if err != nil {
			t.Fatalf("web %q: %v", tc.web, err)
		}
		if got := serves(cfg.Edge.Pages, "/"); got != tc.want {
			t.Errorf("web client %q nats %q serves / = %v, want %v", tc.web, tc.nats, got, tc.want)
		}
		if !serves(cfg.Edge.Pages, "/avatar/") {
			t.Errorf("web client %q nats %q: /avatar/ not served", tc.web, tc.nats)
		}
	}
	if _, err := (flags{webClient: "sometimes"}).gatewayConfig(); err == nil || !strings.Contains(err.Error(), "MOBILE_WEB_CLIENT") {
		t.Fatalf("web client sometimes: %v, want an error naming MOBILE_WEB_CLIENT", err)
	}
}

func serves(h http.Handler, path string) bool {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code == http.StatusOK
}

// TestPagesOnTheWebSocketAddress: the avatar page and the browser client are
// served on the WebSocket's address next to /ws, and ready's avatar_url
// names the avatar page at the host the phone connected to unless
// MOBILE_AVATAR_URL says otherwise.
func TestPagesOnTheWebSocketAddress(t *testing.T) {
	clearEnv(t)
	t.Setenv("MOBILE_TOKEN", "my-token")
	url, _, stop := runNode(t, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-drain-window=200ms"))
	defer stop()
	base := "http://" + strings.TrimSuffix(strings.TrimPrefix(url, "ws://"), "/ws")
	for _, tc := range []struct {
		path, ctype, body string
	}{
		{"/avatar/", "text/html", `src="avatar.js"`},
		{"/avatar/avatar.js", "javascript", "postMessage"},
		{"/avatar/avatar.css", "text/css", "prefers-reduced-motion"},
		{"/", "text/html", "<title>"},
	} {
		resp, err := http.Get(base + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(body), tc.body) {
			t.Errorf("GET %s = %d %q, body has %q: %v", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.body, strings.Contains(string(body), tc.body))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: CSP %q does not keep requests to the page's own origin", tc.path, csp)
		}
	}
	if resp, err := http.Get(base + "/nothing-here"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /nothing-here = %v, %v; want 404", resp, err)
	}
	// The request line is read up to 4 KiB to choose between the pages and
	// the WebSocket: exactly 4 KiB is a page request, one byte more is not.
	for _, tc := range []struct {
		extra int
		want  int
	}{{0, 200}, {1, 404}} {
		line := "GET /avatar/?q= HTTP/1.1\r\n"
		target := "/avatar/?q=" + strings.Repeat("a", 4096-len(line)+tc.extra)
		resp, err := http.Get(base + target)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("request line of %d bytes: %d, want %d", 4096+tc.extra, resp.StatusCode, tc.want)
		}
	}

	// The WebSocket still answers at /ws, and names the avatar page.
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	ready, err := c.Hello(testCtx(t), "my-token", protocol.Device{ID: "tel-1"}, protocol.User{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ready.Str("avatar_url"), base+"/avatar/"; got != want {
		t.Fatalf("avatar_url = %q, want %q", got, want)
	}
}

func TestAvatarURLSetAndWebClientOff(t *testing.T) {
	clearEnv(t)
	t.Setenv("MOBILE_TOKEN", "my-token")
	t.Setenv("MOBILE_AVATAR_URL", "https://agent.example.com/face/")
	t.Setenv("MOBILE_WEB_CLIENT", "off")
	url, _, stop := runNode(t, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-drain-window=200ms"))
	defer stop()
	base := "http://" + strings.TrimSuffix(strings.TrimPrefix(url, "ws://"), "/ws")
	if resp, err := http.Get(base + "/"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET / with MOBILE_WEB_CLIENT=off = %v, %v; want 404", resp, err)
	}
	if resp, err := http.Get(base + "/avatar/"); err != nil || resp.StatusCode != 200 {
		t.Errorf("GET /avatar/ = %v, %v; want 200", resp, err)
	}
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	ready, err := c.Hello(testCtx(t), "my-token", protocol.Device{ID: "tel-1"}, protocol.User{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ready.Str("avatar_url"); got != "https://agent.example.com/face/" {
		t.Fatalf("avatar_url = %q, want MOBILE_AVATAR_URL", got)
	}
}

// mib prints a byte count in whole MiB, as the size flags take it.
func mib(n int64) string {
	if n%(1<<20) != 0 {
		return fmt.Sprintf("%d bytes", n)
	}
	return strconv.FormatInt(n>>20, 10)
}

func TestSizeValues(t *testing.T) {
	clearEnv(t)
	for _, bad := range []string{"0", "-5", "abc", "1.5", "1048577"} {
		if _, err := parse(t, "-max-read="+bad); err == nil {
			t.Errorf("-max-read=%q accepted", bad)
		}
	}
	if got := mustParse(t, "-max-read=1048576").edgeCfg.MaxReadBytes; got != 1<<40 {
		t.Errorf("-max-read=1048576 → %d bytes, want 1 TiB", got)
	}
}

// seconds says whether the flag name is a duration in seconds.
func seconds(flag string) bool {
	for _, suffix := range []string{"-ttl", "-window", "-interval", "-timeout", "-wait", "-lease"} {
		if strings.HasSuffix(flag, suffix) {
			return true
		}
	}
	return false
}

// TestSettingsRefuseWhatCannotWork: settings that cannot work refuse the
// start with an error that begins with the variable to fix. An ack wait as
// long as the router's delivery wait would count every acked message as
// lost; an owner TTL under 3 s cannot be renewed every third of it; each
// passes one step inside its bound.
func TestSettingsRefuseWhatCannotWork(t *testing.T) {
	for _, tc := range []struct{ env, bad, good, want string }{
		{"MOBILE_ACK_WAIT", "15", "14", "MOBILE_ACK_WAIT: 15s must be shorter than a delivery's 15s"},
		{"MOBILE_OWNER_TTL", "2", "3", "MOBILE_OWNER_TTL: 2s is under 3 s"},
	} {
		clearEnv(t)
		t.Setenv(tc.env, tc.good)
		if _, err := mustParse(t).gatewayConfig(); err != nil {
			t.Errorf("%s=%s: %v", tc.env, tc.good, err)
		}
		t.Setenv(tc.env, tc.bad)
		if _, err := mustParse(t).gatewayConfig(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s=%s: %v, want an error starting %q", tc.env, tc.bad, err, tc.want)
		}
	}
}

// TestListenErrorsNameTheVariable: a listen address that cannot work is
// refused at once, naming its variable, even while Redis and NATS do not
// answer (the process would otherwise wait for them first); one that is
// taken is refused naming it too.
func TestListenErrorsNameTheVariable(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct{ name, listen, redis, want string }{
		{"port out of range", "127.0.0.1:99999", "redis://127.0.0.1:1", "MOBILE_LISTEN: \"127.0.0.1:99999\" is not a host:port"},
		{"no port", "127.0.0.1", "redis://127.0.0.1:1", "MOBILE_LISTEN: \"127.0.0.1\" is not a host:port"},
		{"taken", taken.Addr().String(), "", "MOBILE_LISTEN: listen tcp " + taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := flags{listen: tc.listen, router: "auto", token: "x", node: gateway.NodeFlags{LogLevel: "info", RedisURL: tc.redis, AdminListen: "off"}}
			err := run(testCtx(t), f, io.Discard, io.Discard)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("run = %v, want an error starting %q", err, tc.want)
			}
		})
	}
}

// TestRedisURLErrorsSayWhatIsExpected: a REDIS_URL that is no redis://
// URL is refused at once with what was given (its password hidden) and
// what is expected, not go-redis's bare "invalid URL scheme".
func TestRedisURLErrorsSayWhatIsExpected(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"localhost:6379", `REDIS_URL: "localhost:6379" is not a redis:// or rediss:// URL`},
		{"127.0.0.1:6379", `REDIS_URL: "127.0.0.1:6379" is not a redis:// or rediss:// URL`},
		{"http://127.0.0.1:1", `REDIS_URL: "http://127.0.0.1:1" is not a redis:// or rediss:// URL`},
		{"user:secret-pw@redis:6379", `REDIS_URL: "xxxxx@redis:6379" is not a redis:// or rediss:// URL`},
		{"redis:6379?password=secret-pw", `REDIS_URL: "redis:6379?xxxxx" is not a redis:// or rediss:// URL`},
	} {
		t.Run(tc.url, func(t *testing.T) {
			for _, mode := range []string{"single", "cluster", "sentinel"} {
				f := flags{listen: "127.0.0.1:0", router: "auto", token: "x", node: gateway.NodeFlags{LogLevel: "info", RedisURL: tc.url, RedisMode: mode, AdminListen: "off"}}
				err := run(testCtx(t), f, io.Discard, io.Discard)
				if err == nil || err.Error() != tc.want {
					t.Errorf("REDIS_MODE=%s: run = %v, want %s", mode, err, tc.want)
				}
			}
		})
	}
}

// TestPprof: MOBILE_PPROF=on serves the Go profiles on the admin port, the
// default does not, and a value other than on or off refuses to start.
func TestPprof(t *testing.T) {
	clearEnv(t)
	for _, on := range []bool{false, true} {
		args := []string{"-listen=127.0.0.1:0", "-admin-listen=127.0.0.1:0", "-token=tok"}
		if on {
			args = append(args, "-pprof=on")
		}
		f := mustParse(t, args...)
		_, _, stderr, stop := testsvc.Run(t, "gateway listening", func(ctx context.Context, stdout, stderr io.Writer) error {
			return run(ctx, f, stdout, stderr)
		})
		admin := testsvc.ListeningURL(t, stderr.String(), "admin listening")
		resp, err := http.Get(admin + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		served := resp.StatusCode == http.StatusOK && strings.Contains(string(body), "goroutine profile:")
		if served != on {
			t.Fatalf("MOBILE_PPROF on=%v: /debug/pprof/goroutine answered %d %.100q", on, resp.StatusCode, body)
		}
		if err := stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
	var out bytes.Buffer
	err := run(testCtx(t), mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-token=tok", "-pprof=yes"), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "MOBILE_PPROF") {
		t.Fatalf("run with -pprof=yes = %v, want an error naming MOBILE_PPROF", err)
	}
}

// TestTenantsFile: a tenants file that does not parse stops the start
// with the file and the line; a good one lets a cluster edge start
// without MOBILE_TOKEN, makes no token up, and admits its owners' keys.
func TestTenantsFile(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte("tenants:\n  - id: acme\n    colour: red\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-tenants-file="+path)
	err := run(testCtx(t), f, io.Discard, io.Discard)
	if want := path + `: line 3: an owner has an unknown field "colour"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("run with a bad tenants file = %v, want %q", err, want)
	}

	if err := os.WriteFile(path, []byte("tenants:\n  - id: acme\n    keys: [{id: app, kind: app, secret: s3}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOBILE_TENANTS_FILE", path)
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379")
	if _, err := mustParse(t).gatewayConfig(); err != nil {
		t.Fatalf("a cluster edge with a tenants file and no MOBILE_TOKEN: %v", err)
	}
	t.Setenv("REDIS_URL", "")
	url, stdout, stop := runNode(t, mustParse(t, "-listen=127.0.0.1:0", "-admin-listen=off", "-drain-window=200ms"))
	defer stop() //nolint:errcheck // the test's end
	c, err := client.Dial(testCtx(t), url, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, err := c.Hello(testCtx(t), "hmt_acme.app.s3", protocol.Device{ID: "tel-1"}, protocol.User{}); err != nil {
		t.Fatalf("hello with acme's key: %v", err)
	}
	if out := stdout.String(); out != "" {
		t.Fatalf("stdout with a tenants file = %q, want no token made up", out)
	}
}
