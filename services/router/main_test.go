package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/dispatch"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/edge"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
)

// TestMain runs main itself when asked to, so that the tests can check
// its exit status and output.
func TestMain(m *testing.M) {
	if os.Getenv("ROUTER_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"router"}, strings.Fields(os.Getenv("ROUTER_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// clearEnv unsets every variable the command reads, for the test.
func clearEnv(t *testing.T) {
	var f flags
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	f.register(fs)
	testsvc.ClearEnv(t, fs, "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME")
}

func parse(t *testing.T, args ...string) (flags, error) {
	t.Helper()
	var f flags
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
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
	want := flags{listen: "127.0.0.1:8788", agent: agent.Choice{Name: "demo", OpenAIBaseURL: "https://api.openai.com/v1", OpenAITimeout: 120 * time.Second}, eventsMax: 10000,
		router: router.Config{PromptTTL: protocol.DefaultPromptTTL, PromptMaxTTL: router.DefaultPromptMaxTTL, SessionQueue: 1000, JournalLease: 15 * time.Second, OpTimeout: 5 * time.Second},
		outbox: dispatch.OutboxConfig{Max: 1024, TTL: 24 * time.Hour, Bytes: 32 << 20, StoreBytes: 1 << 30, PushEvery: 15 * time.Minute},
		node:   gateway.NodeFlags{RedisMode: "single", RedisPrefix: "hermes:", RedisPool: 32, LogLevel: "info", AdminListen: "127.0.0.1:8790", MaxBlob: 1 << 30, Pprof: "off", BlobTTL: 15 * time.Minute},
	}
	if f := mustParse(t); !reflect.DeepEqual(f, want) {
		t.Fatalf("defaults = %+v, want %+v", f, want)
	}
}

func TestEnvAndFlags(t *testing.T) {
	for _, tc := range []struct {
		env, flag       string
		envVal, flagVal string
		field           func(flags) string
	}{
		{"MOBILE_ROUTER_LISTEN", "listen", "0.0.0.0:9000", "127.0.0.1:9001", func(f flags) string { return f.listen }},
		{"NATS_URL", "nats-url", "nats://env:4222", "nats://flag:4222", func(f flags) string { return f.node.NATSURL }},
		{"NATS_PREFIX", "nats-prefix", "env.", "flag.", func(f flags) string { return f.node.NATSPrefix }},
		{"REDIS_URL", "redis-url", "redis://env:6379", "redis://flag:6379", func(f flags) string { return f.node.RedisURL }},
		{"REDIS_PREFIX", "redis-prefix", "env:", "flag:", func(f flags) string { return f.node.RedisPrefix }},
		{"MOBILE_DELIVER_TOKENS", "deliver-tokens", "d1,d2", "d3", func(f flags) string { return string(f.node.DeliverTokens) }},
		{"MOBILE_AGENT_TOKENS", "agent-tokens", "a1", "a2,a3", func(f flags) string { return string(f.agentTokens) }},
		{"MOBILE_HOME_DEVICE", "home-device", "tel-home", "tel-other", func(f flags) string { return f.node.HomeDevice }},
		{"AGENT", "agent", "link", "demo", func(f flags) string { return f.agent.Name }},
		{"MOBILE_EVENTS_MAX", "events-max", "500", "700", func(f flags) string { return strconv.Itoa(f.eventsMax) }},
		{"MOBILE_LOG_LEVEL", "log-level", "debug", "warn", func(f flags) string { return f.node.LogLevel }},
		{"MOBILE_PROMPT_TTL", "prompt-ttl", "45", "90", func(f flags) string { return f.router.PromptTTL.String() }},
		{"MOBILE_ROUTER_OP_TIMEOUT", "router-op-timeout", "45", "90", func(f flags) string { return f.router.OpTimeout.String() }},
		{"MOBILE_ADMIN_LISTEN", "admin-listen", "off", "127.0.0.1:9002", func(f flags) string { return f.node.AdminListen }},
		{"MOBILE_PPROF", "pprof", "on", "off", func(f flags) string { return f.node.Pprof }},
		{"OPENAI_BASE_URL", "openai-base-url", "http://env:11434/v1", "http://flag:8000/v1", func(f flags) string { return f.agent.OpenAIBaseURL }},
		{"OPENAI_API_KEY", "openai-api-key", "sk-env", "sk-flag", func(f flags) string { return string(f.agent.OpenAIKey) }},
		{"OPENAI_MODEL", "openai-model", "llama3", "gpt-4o-mini", func(f flags) string { return f.agent.OpenAIModel }},
		{"OPENAI_SYSTEM_PROMPT", "openai-system-prompt", "Be brief.", "Be kind.", func(f flags) string { return f.agent.OpenAIPrompt }},
		{"MOBILE_MAX_BLOB_MIB", "max-blob", "45", "90", func(f flags) string { return strconv.FormatInt(f.node.MaxBlob>>20, 10) }},
		{"MOBILE_OUTBOX_MIB", "outbox-mib", "45", "90", func(f flags) string { return strconv.Itoa(f.outbox.Bytes >> 20) }},
		{"MOBILE_MAX_OUTBOX_MIB", "max-outbox", "45", "90", func(f flags) string { return strconv.FormatInt(f.outbox.StoreBytes>>20, 10) }},
	} {
		t.Run(tc.env, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tc.env, tc.envVal)
			want := tc.envVal
			if tc.env == "MOBILE_PROMPT_TTL" || tc.env == "MOBILE_ROUTER_OP_TIMEOUT" {
				want = "45s"
			}
			if got := tc.field(mustParse(t)); got != want {
				t.Fatalf("$%s=%q → %q, want %q", tc.env, tc.envVal, got, want)
			}
			want = tc.flagVal
			if tc.env == "MOBILE_PROMPT_TTL" || tc.env == "MOBILE_ROUTER_OP_TIMEOUT" {
				want = "1m30s"
			}
			if got := tc.field(mustParse(t, "-"+tc.flag+"="+tc.flagVal)); got != want {
				t.Fatalf("-%s=%q with $%s=%q → %q, want the flag's %q", tc.flag, tc.flagVal, tc.env, tc.envVal, got, want)
			}
		})
	}
}

func TestSettings(t *testing.T) {
	clearEnv(t)
	for k, v := range map[string]string{
		"NATS_URL": "nats://n:4222", "REDIS_URL": "redis://r:6379", "MOBILE_DELIVER_TOKENS": " cron-1, cron-2,,",
		"MOBILE_AGENT_TOKENS": "agent-1", "MOBILE_HOME_DEVICE": "tel-1", "MOBILE_PROMPT_TTL": "45", "AGENT": " Link ",
		"MOBILE_EVENTS_MAX": "250", "MOBILE_LOG_LEVEL": "debug", "MOBILE_OUTBOX_MAX": "64", "MOBILE_OUTBOX_TTL": "120",
		"MOBILE_SESSION_QUEUE": "50", "MOBILE_JOURNAL_LEASE": "6", "MOBILE_BLOB_TTL": "300",
	} {
		t.Setenv(k, v)
	}
	s, err := mustParse(t).settings()
	if err != nil {
		t.Fatal(err)
	}
	want := settings{level: -4, agent: "link", eventsMax: 250,
		api: router.APIConfig{DeliverTokens: []string{"cron-1", "cron-2"}, AgentTokens: []string{"agent-1"}, HomeDevice: "tel-1"},
		router: router.Config{PromptTTL: 45 * time.Second, PromptMaxTTL: router.DefaultPromptMaxTTL, SessionQueue: 50,
			JournalLease: 6 * time.Second, BlobTTL: 5 * time.Minute, OpTimeout: 5 * time.Second},
		outbox: dispatch.OutboxConfig{Max: 64, TTL: 2 * time.Minute, Bytes: 32 << 20, StoreBytes: 1 << 30, PushEvery: 15 * time.Minute}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("settings = %+v, want %+v", s, want)
	}
}

// TestHomeDeviceBound: a MOBILE_HOME_DEVICE of 120 characters is taken;
// 121, which no device can have, is refused naming the variable.
func TestHomeDeviceBound(t *testing.T) {
	clearEnv(t)
	t.Setenv("NATS_URL", "nats://n:4222")
	t.Setenv("REDIS_URL", "redis://r:6379")
	at := strings.Repeat("é", protocol.MaxDeviceFieldChars)
	t.Setenv("MOBILE_HOME_DEVICE", at)
	if s, err := mustParse(t).settings(); err != nil || s.api.HomeDevice != at {
		t.Fatalf("120 characters: %v", err)
	}
	t.Setenv("MOBILE_HOME_DEVICE", at+"x")
	if _, err := mustParse(t).settings(); err == nil || !strings.Contains(err.Error(), "MOBILE_HOME_DEVICE") {
		t.Fatalf("121 characters: %v, want an error naming MOBILE_HOME_DEVICE", err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	ok := flags{listen: "127.0.0.1:0", agent: agent.Choice{Name: "demo"}, eventsMax: 10, node: gateway.NodeFlags{NATSURL: "nats://127.0.0.1:1", RedisURL: "redis://127.0.0.1:1", LogLevel: "info"}}
	for _, tc := range []struct {
		name   string
		mutate func(*flags)
		want   string
	}{
		{"no NATS_URL", func(f *flags) { f.node.NATSURL = "" }, "NATS_URL"},
		{"no REDIS_URL", func(f *flags) { f.node.RedisURL = "" }, "REDIS_URL"},
		{"agent", func(f *flags) { f.agent.Name = "smart" }, "AGENT"},
		{"openai without a model", func(f *flags) { f.agent.Name = "openai" }, "OPENAI_MODEL"},
		{"openai base URL", func(f *flags) {
			f.agent.Name, f.agent.OpenAIModel, f.agent.OpenAIBaseURL = "openai", "m", "api.example/v1"
		}, "OPENAI_BASE_URL"},
		{"events max", func(f *flags) { f.eventsMax = 0 }, "MOBILE_EVENTS_MAX"},
		{"log level", func(f *flags) { f.node.LogLevel = "loud" }, "MOBILE_LOG_LEVEL"},
		{"redis URL", func(f *flags) { f.node.RedisURL = "http://x" }, "REDIS_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ok
			tc.mutate(&f)
			var stdout, stderr bytes.Buffer
			err := run(ctxFor(t, 10*time.Second), f, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestMainExits: the binary says what is missing and exits non-zero.
func TestMainExits(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct {
		env  []string
		code int
		want string
	}{
		{nil, 1, "NATS_URL is required"},
		{[]string{"NATS_URL=nats://127.0.0.1:1"}, 1, "REDIS_URL is required"},
		{[]string{"MOBILE_PROMPT_TTL=soon"}, 2, "MOBILE_PROMPT_TTL"},
		{[]string{"MOBILE_EVENTS_MAX=many"}, 2, "MOBILE_EVENTS_MAX"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append(tc.env, "ROUTER_TEST_RUN_MAIN=1")...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != tc.code || !strings.Contains(string(out), tc.want) {
			t.Errorf("router with %q: %v, output %q; want exit %d saying %q", tc.env, err, out, tc.code, tc.want)
		}
	}
}

// TestVersionFlag: -version prints the build and exits 0, though the
// settings a router needs are missing.
func TestVersionFlag(t *testing.T) {
	clearEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ROUTER_TEST_RUN_MAIN=1", "ROUTER_TEST_ARGS=-version")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("router -version: %v, output %q", err, out)
	}
	if !strings.HasPrefix(string(out), "router ") || !strings.Contains(string(out), " revision ") || !strings.Contains(string(out), runtime.Version()) {
		t.Errorf("router -version printed %q, want the command, its revision and %s", out, runtime.Version())
	}
	if strings.Count(string(out), "\n") != 1 {
		t.Errorf("router -version printed more than its version: %q", out)
	}
}

// TestHelpHidesTokens: -help shows the defaults, which come from the
// environment, but not the tokens.
func TestHelpHidesTokens(t *testing.T) {
	clearEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ROUTER_TEST_RUN_MAIN=1", "ROUTER_TEST_ARGS=-help",
		"MOBILE_DELIVER_TOKENS=cron-secret", "MOBILE_AGENT_TOKENS=agent-secret", "OPENAI_API_KEY=sk-secret")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "-agent-tokens") {
		t.Fatalf("-help printed %q", out)
	}
	if strings.Contains(string(out), "secret") {
		t.Fatalf("-help shows a token:\n%s", out)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func uniquePrefix(t *testing.T, url string) string {
	prefix := "hermes-routermain:" + testsvc.RandomHex(6) + ":"
	opts, _ := redis.ParseURL(url)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() {
		defer rdb.Close()
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// runRouter runs run(f) in the background and returns the URL of its
// "router listening" log line, its log, and a function that cancels run
// and returns its result.
func runRouter(t *testing.T, f flags) (url string, logs *testsvc.Buffer, stop func() error) {
	t.Helper()
	url, _, logs, stop = testsvc.Run(t, "router listening", func(ctx context.Context, _, stderr io.Writer) error {
		return run(ctx, f, io.Discard, stderr)
	})
	return url, logs, stop
}

func call(t *testing.T, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t, 30*time.Second), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s %s: %d %q is not JSON", method, url, resp.StatusCode, data)
	}
	return resp.StatusCode, m
}

// TestRunCluster runs the command with AGENT=link next to a gateway node
// on the same NATS and Redis: the phone's text reaches GET /v1/events, the
// agent's answer and a cron deliver reach the phone, and a cancel shuts
// the router down cleanly.
func TestRunCluster(t *testing.T) {
	clearEnv(t)
	rurl := testsvc.RedisURL(t)
	nurl := testsvc.NATSURL(t)
	prefix := uniquePrefix(t, rurl)
	subjects := "rm" + strings.Trim(strings.TrimPrefix(prefix, "hermes-routermain"), ":") + "."
	// The subjects of this cluster are its own (NATS_PREFIX), as the
	// router's and the edge's must agree.
	f := mustParse(t, "-listen=127.0.0.1:0", "-nats-url="+nurl, "-nats-prefix="+subjects, "-redis-url="+rurl, "-redis-prefix="+prefix,
		"-agent=link", "-deliver-tokens=cron-token", "-agent-tokens=agent-token", "-log-level=debug", "-admin-listen=127.0.0.1:0")
	url, logs, stop := runRouter(t, f)
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.HasSuffix(url, ":0") {
		t.Fatalf("listening url %q, want http://127.0.0.1:<port>", url)
	}
	admin := testsvc.ListeningURL(t, logs.String(), "admin listening")
	if !strings.HasPrefix(admin, "http://127.0.0.1:") || admin == url {
		t.Fatalf("admin listening url %q, want its own http://127.0.0.1:<port>", admin)
	}
	code, m := call(t, "GET", admin+"/readyz", "", "")
	checks, _ := m["checks"].(map[string]any)
	if code != 200 || m["state"] != "ready" || checks["store"] != "ok" || checks["bus"] != "ok" {
		t.Fatalf("admin /readyz: %d %v, want 200 ready with store and bus ok", code, m)
	}

	if code, _ := call(t, "GET", url+"/healthz", "", ""); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if code, m := call(t, "GET", url+"/readyz", "", ""); code != 200 || m["ok"] != true {
		t.Fatalf("readyz: %d %v", code, m)
	}
	if code, m := call(t, "POST", url+"/v1/deliver", "", `{"target":"x","text":"y"}`); code != 401 || m["error"] != "auth_failed" {
		t.Fatalf("deliver without a token: %d %v", code, m)
	}
	if code, m := call(t, "POST", url+"/v1/deliver", "cron-token", `{"target":"nobody","text":"y"}`); code != 404 || m["error"] != "device_offline" {
		t.Fatalf("deliver to an offline device: %d %v", code, m)
	}

	node, err := gateway.Start(context.Background(), gateway.Config{
		Listen: "127.0.0.1:0", NATSURL: nurl, NATSPrefix: subjects, RedisURL: rurl, RedisPrefix: prefix,
		Edge: edge.Config{Auth: edge.AuthConfig{Token: "phone-token"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	phone, err := client.Dial(ctxFor(t, 10*time.Second), node.URL(), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer phone.CloseNow()
	if _, err := phone.Hello(ctxFor(t, 10*time.Second), "phone-token", protocol.Device{ID: "tel-1"}, protocol.User{ID: "u-1"}); err != nil {
		t.Fatal(err)
	}
	if err := phone.Text("m-1", "hello router"); err != nil {
		t.Fatal(err)
	}
	code, m = call(t, "GET", url+"/v1/events?wait=10", "agent-token", "")
	evs, _ := m["events"].([]any)
	if code != 200 || len(evs) != 1 {
		t.Fatalf("events: %d %v", code, m)
	}
	ev := evs[0].(map[string]any)["event"].(map[string]any)
	if ev["text"] != "hello router" || ev["session"] != "mobile:tel-1" {
		t.Fatalf("event %v", ev)
	}

	if code, m := call(t, "POST", url+"/v1/sessions/mobile:tel-1/messages", "agent-token", `{"id":"r-1","text":"hello phone"}`); code != 200 || m["id"] != "r-1" {
		t.Fatalf("message: %d %v", code, m)
	}
	if text, _, err := phone.CollectMessage(ctxFor(t, 10*time.Second), "r-1"); err != nil || text != "hello phone" {
		t.Fatalf("the phone got %q, %v", text, err)
	}
	if code, m := call(t, "POST", url+"/v1/deliver", "cron-token", `{"target":"mobile:tel-1","id":"c-1","text":"from cron"}`); code != 200 {
		t.Fatalf("deliver: %d %v", code, m)
	}
	if text, _, err := phone.CollectMessage(ctxFor(t, 10*time.Second), "c-1"); err != nil || text != "from cron" {
		t.Fatalf("the phone got %q, %v", text, err)
	}

	// An open event stream does not hold up the shutdown.
	req, _ := http.NewRequest("GET", url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer agent-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("event stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("run = %v after cancel, want nil; logs:\n%s", err, logs)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	if !strings.Contains(logs.String(), `"msg":"shutting down"`) {
		t.Fatalf("no shutdown log line:\n%s", logs)
	}
	if strings.Contains(logs.String(), "agent-token") || strings.Contains(logs.String(), "cron-token") {
		t.Fatalf("a token in the logs:\n%s", logs)
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Fatal("the API still answers after run returned")
	}
	if _, err := http.Get(admin + "/healthz"); err == nil {
		t.Fatal("the admin port still answers after run returned")
	}
}

// TestSettingsOpenAI: AGENT=openai takes the OPENAI_* variables.
func TestSettingsOpenAI(t *testing.T) {
	clearEnv(t)
	for k, v := range map[string]string{
		"NATS_URL": "nats://n:4222", "REDIS_URL": "redis://r:6379", "AGENT": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:11434/v1",
		"OPENAI_API_KEY": "sk-1", "OPENAI_MODEL": " llama3 ", "OPENAI_SYSTEM_PROMPT": "Be brief.", "OPENAI_TIMEOUT": "30",
	} {
		t.Setenv(k, v)
	}
	s, err := mustParse(t).settings()
	if err != nil {
		t.Fatal(err)
	}
	want := agent.OpenAIConfig{BaseURL: "http://127.0.0.1:11434/v1", APIKey: "sk-1", Model: "llama3", SystemPrompt: "Be brief.", Timeout: 30 * time.Second}
	if s.agent != "openai" || s.openai != want {
		t.Fatalf("settings agent %q, openai %+v; want openai, %+v", s.agent, s.openai, want)
	}
}

// TestSettingsRefuseWhatCannotWork: a journal lease under 3 s cannot be
// renewed every third of it; the router refuses to start, naming it.
func TestSettingsRefuseWhatCannotWork(t *testing.T) {
	clearEnv(t)
	t.Setenv("MOBILE_JOURNAL_LEASE", "2")
	t.Setenv("NATS_URL", "nats://n:4222")
	t.Setenv("REDIS_URL", "redis://r:6379")
	const want = "MOBILE_JOURNAL_LEASE: 2s is under 3 s"
	if _, err := mustParse(t).settings(); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a 2 s journal lease: %v, want an error starting %q", err, want)
	}
	t.Setenv("MOBILE_JOURNAL_LEASE", "3")
	if _, err := mustParse(t).settings(); err != nil {
		t.Fatalf("a 3 s journal lease: %v", err)
	}
}

// TestListenErrorNamesTheVariable: a MOBILE_ROUTER_LISTEN that cannot work
// is refused at once, naming it, though Redis and NATS do not answer.
func TestListenErrorNamesTheVariable(t *testing.T) {
	f := flags{listen: "127.0.0.1:99999", agent: agent.Choice{Name: "demo"}, eventsMax: 10,
		node: gateway.NodeFlags{NATSURL: "nats://127.0.0.1:1", RedisURL: "redis://127.0.0.1:1", LogLevel: "info", AdminListen: "off"},
	}
	const want = "MOBILE_ROUTER_LISTEN: \"127.0.0.1:99999\" is not a host:port"
	if err := run(ctxFor(t, 10*time.Second), f, io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("run = %v, want an error starting %q", err, want)
	}
}
