package router_test

// Traces through the API: a caller's W3C traceparent is the parent of the
// router's server span, and the deliveries the request makes (router.deliver,
// then the edge's edge.deliver across NATS) are its descendants: for
// POST /v1/deliver, each item of POST /v1/deliver/batch and every
// /v1/sessions/… endpoint. An agent that answers with the traceparent of
// the event it answers puts its answer in the phone's trace. The spans go
// to an in-memory recorder; test/cluster's TestTraceFromCallerToPhone
// checks the same through OTLP/HTTP from the real processes.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/router"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// tracedEnv is an env whose edge and router record their spans in rec and
// write their JSON logs (with trace ids) to logs.
type tracedEnv struct {
	*env
	rec  *tracetest.SpanRecorder
	logs *testsvc.Buffer
}

// eachTracedEnv is eachEnv with tracing on.
func eachTracedEnv(t *testing.T, test func(t *testing.T, e *tracedEnv)) {
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		test(t, startTraced(t, false))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		test(t, startTraced(t, true))
	})
}

// startTraced starts the single or the cluster variant (see api_test.go)
// with a Telemetry that records every span.
func startTraced(t *testing.T, cluster bool) *tracedEnv {
	t.Helper()
	return startTracedWith(t, cluster, 0)
}

// startTracedWith is startTraced whose edge waits ackWait (zero:
// nodeConfig's) for a phone's ack.
func startTracedWith(t *testing.T, cluster bool, ackWait time.Duration) *tracedEnv {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "hermes-test", SpanProcessor: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Shutdown(context.Background()) })
	logs := testsvc.NewBuffer()
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(io.MultiWriter(logs, testsvc.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelDebug})))
	te := &tracedEnv{rec: rec, logs: logs}

	nc := nodeConfig()
	nc.Telemetry = tel
	if ackWait > 0 {
		nc.Edge.AckWait = ackWait
	}
	if !cluster {
		nc.Router, nc.NewAgent, nc.APIListen, nc.API = true, agent.Named("link", agent.OpenAIConfig{}, 0), "127.0.0.1:0", apiConfig(nil)
		g, err := gateway.Start(t.Context(), nc, log)
		if err != nil {
			t.Fatalf("start node: %v", err)
		}
		t.Cleanup(func() { g.Close() })
		te.env = &env{node: g, router: g.Router, store: g.Store, api: g.API, url: g.APIURL()}
		return te
	}
	redisURL, natsURL := testsvc.RedisURL(t), testsvc.NATSURL(t)
	prefix := "hermes-routertest:" + testsvc.RandomHex(6) + ":"
	cleanRedis(t, redisURL, prefix)
	natsPrefix := "rt" + testsvc.RandomHex(3) + "."
	nc.NATSURL, nc.NATSPrefix, nc.RedisURL, nc.RedisPrefix = natsURL, natsPrefix, redisURL, prefix
	g, err := gateway.Start(t.Context(), nc, log.With("c", "node"))
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	st, err := redisstore.New(t.Context(), redisstore.Options{URL: redisURL, Prefix: prefix, Telemetry: tel})
	if err != nil {
		t.Fatalf("redisstore: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := natsbus.Connect(natsURL, natsbus.Options{Logger: log, Name: "router-test", SubjectPrefix: natsPrefix, Telemetry: tel})
	if err != nil {
		t.Fatalf("natsbus: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	r := router.New(router.Config{Telemetry: tel}, st, b, agent.NewLink(st, 1000), log.With("c", "router"))
	if err := r.Start(); err != nil {
		t.Fatalf("router: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	te.env = serve(t, &env{node: g, router: r, store: st, redisURL: redisURL, redisPrefix: prefix}, apiConfig(nil))
	return te
}

// callerTrace is the span of a caller outside the gateway: its trace id,
// span id and traceparent header.
type callerTrace struct {
	trace       trace.TraceID
	span        trace.SpanID
	traceparent string
}

func newCallerTrace(t *testing.T) callerTrace {
	t.Helper()
	tp := fmt.Sprintf("00-%s-%s-01", testsvc.RandomHex(16), testsvc.RandomHex(8))
	sc := parseTraceParent(t, tp)
	return callerTrace{trace: sc.TraceID(), span: sc.SpanID(), traceparent: tp}
}

// parseTraceParent reads a W3C traceparent.
func parseTraceParent(t testing.TB, tp string) trace.SpanContext {
	t.Helper()
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		t.Fatalf("traceparent %q is not version-trace-span-flags", tp)
	}
	tid, err1 := trace.TraceIDFromHex(parts[1])
	sid, err2 := trace.SpanIDFromHex(parts[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("traceparent %q: %v %v", tp, err1, err2)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
}

// callTraced is e.call with a traceparent header.
func (e *tracedEnv) callTraced(t *testing.T, method, path, token, traceparent string, body any) response {
	t.Helper()
	return callURL(t, e.url, method, path, token, body, http.Header{"Traceparent": {traceparent}})
}

// spansOf returns the ended spans of trace tid.
func (e *tracedEnv) spansOf(tid trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.rec.Ended() {
		if s.SpanContext().TraceID() == tid {
			out = append(out, s)
		}
	}
	return out
}

// waitSpans waits until cond accepts the ended spans of trace tid and
// returns them; the test fails after 10 s, listing what there is.
func (e *tracedEnv) waitSpans(t *testing.T, tid trace.TraceID, what string, cond func([]sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	t.Helper()
	var spans []sdktrace.ReadOnlySpan
	if !testsvc.Eventually(10*time.Second, func() bool {
		spans = e.spansOf(tid)
		return cond(spans)
	}) {
		t.Fatalf("trace %s: no %s within 10 s; its spans:%s", tid, what, describeSpans(spans))
	}
	return spans
}

func describeSpans(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %s (%s) parent %s", s.SpanContext().SpanID(), s.Name(), s.SpanKind(), s.Parent().SpanID())
	}
	if len(spans) == 0 {
		b.WriteString(" none")
	}
	return b.String()
}

// childrenOf returns the spans among spans named name whose parent is
// parent.
func childrenOf(spans []sdktrace.ReadOnlySpan, parent trace.SpanID, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && s.Parent().SpanID() == parent {
			out = append(out, s)
		}
	}
	return out
}

// serverSpan returns the server span named name whose parent is parent.
func serverSpan(spans []sdktrace.ReadOnlySpan, parent trace.SpanID, name string) sdktrace.ReadOnlySpan {
	for _, s := range childrenOf(spans, parent, name) {
		if s.SpanKind() == trace.SpanKindServer {
			return s
		}
	}
	return nil
}

// deliveredUnder reports whether a router.deliver child of parent has an
// edge.deliver child of op: the output went through the router to the
// edge's socket inside parent's trace.
func deliveredUnder(spans []sdktrace.ReadOnlySpan, parent trace.SpanID, op string) bool {
	for _, rd := range childrenOf(spans, parent, "router.deliver") {
		for _, ed := range childrenOf(spans, rd.SpanContext().SpanID(), "edge.deliver") {
			if attr(ed, "hermes.output.op") == op && ed.Parent().IsRemote() {
				return true
			}
		}
	}
	return false
}

// attr is the string value of s's attribute key.
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// apiLogLine returns the "api request" log line of method and route whose
// trace_id is tid, or nil.
func (e *tracedEnv) apiLogLine(method, route string, tid trace.TraceID) map[string]any {
	for line := range strings.Lines(e.logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec["msg"] == "api request" && rec["method"] == method && rec["route"] == route && rec["trace_id"] == tid.String() {
			return rec
		}
	}
	return nil
}

// TestTraceDeliverContinuesCaller: POST /v1/deliver with a caller's
// traceparent is a server span whose parent is the caller's span, in the
// caller's trace; the delivery's router.deliver is its child and the
// edge's edge.deliver (across NATS) the child of that. The request's log
// line carries the trace and the server span's ids.
func TestTraceDeliverContinuesCaller(t *testing.T) {
	eachTracedEnv(t, func(t *testing.T, e *tracedEnv) {
		dev := device("tel")
		phone := e.phone(t, dev)
		caller := newCallerTrace(t)
		wantOK(t, e.callTraced(t, "POST", "/v1/deliver", deliverToken, caller.traceparent,
			map[string]any{"target": dev, "id": "d-1", "text": "from cron"}))
		if f := expect(t, phone, protocol.TypeMessage); f.Str("text") != "from cron" {
			t.Fatalf("the phone got %s", f)
		}

		var srv sdktrace.ReadOnlySpan
		e.waitSpans(t, caller.trace, "POST /v1/deliver server span with router.deliver and edge.deliver", func(spans []sdktrace.ReadOnlySpan) bool {
			srv = serverSpan(spans, caller.span, "POST /v1/deliver")
			return srv != nil && deliveredUnder(spans, srv.SpanContext().SpanID(), "message")
		})
		if !srv.Parent().IsRemote() {
			t.Error("the server span's parent is not the caller's (remote) span")
		}
		if attr(srv, "http.route") != "/v1/deliver" || attr(srv, "http.response.status_code") != "200" || attr(srv, "http.request.method") != "POST" {
			t.Errorf("server span attributes %v", srv.Attributes())
		}
		for _, a := range srv.Attributes() {
			if strings.Contains(a.Value.String(), dev) || strings.Contains(a.Value.String(), deliverToken) {
				t.Errorf("the server span names the device or the token in %s", a.Key)
			}
		}

		var line map[string]any
		testsvc.Eventually(5*time.Second, func() bool {
			line = e.apiLogLine("POST", "/v1/deliver", caller.trace)
			return line != nil
		})
		if line == nil {
			t.Fatalf("no api request line with trace_id %s in the log", caller.trace)
		}
		if line["span_id"] != srv.SpanContext().SpanID().String() {
			t.Errorf("the api request line has span_id %v, want the server span's %s", line["span_id"], srv.SpanContext().SpanID())
		}

		// Without a traceparent the request starts a trace of its own.
		wantOK(t, e.call(t, "POST", "/v1/deliver", deliverToken, map[string]any{"target": dev, "id": "d-2", "text": "untraced caller"}))
		expect(t, phone, protocol.TypeMessage)
		var root sdktrace.ReadOnlySpan
		testsvc.Eventually(10*time.Second, func() bool {
			for _, s := range e.rec.Ended() {
				if s.Name() == "POST /v1/deliver" && s.SpanContext().TraceID() != caller.trace {
					root = s
					return true
				}
			}
			return false
		})
		if root == nil || root.Parent().IsValid() {
			t.Fatalf("a request without traceparent: server span %v, want one without a parent", root)
		}
	})
}

// TestTraceBatchItems: each delivery of POST /v1/deliver/batch is a
// router.deliver span of its own, a child of the batch's server span (one
// caller operation, one trace and one sampling decision; the request
// answers for every item), and the edge's edge.deliver of each is the
// child of its item's span, although one bus request carried them.
func TestTraceBatchItems(t *testing.T) {
	eachTracedEnv(t, func(t *testing.T, e *tracedEnv) {
		dev1, dev2 := device("tel"), device("tel")
		p1, p2 := e.phone(t, dev1), e.phone(t, dev2)
		caller := newCallerTrace(t)
		r := e.callTraced(t, "POST", "/v1/deliver/batch", deliverToken, caller.traceparent, map[string]any{"deliveries": []map[string]any{
			{"target": dev1, "id": "b-1", "text": "one"},
			{"target": dev2, "id": "b-2", "text": "two"},
			{"target": dev1, "id": "b-3", "text": "three"},
		}})
		if r.status != http.StatusOK {
			t.Fatalf("batch: %d %s", r.status, r.body)
		}
		expect(t, p1, protocol.TypeMessage)
		expect(t, p2, protocol.TypeMessage)
		expect(t, p1, protocol.TypeMessage)

		var srv sdktrace.ReadOnlySpan
		spans := e.waitSpans(t, caller.trace, "batch server span with three items delivered", func(spans []sdktrace.ReadOnlySpan) bool {
			srv = serverSpan(spans, caller.span, "POST /v1/deliver/batch")
			if srv == nil {
				return false
			}
			delivered := 0
			for _, rd := range childrenOf(spans, srv.SpanContext().SpanID(), "router.deliver") {
				delivered += len(childrenOf(spans, rd.SpanContext().SpanID(), "edge.deliver"))
			}
			return delivered >= 3
		})
		items := childrenOf(spans, srv.SpanContext().SpanID(), "router.deliver")
		var parents []trace.SpanID
		for _, rd := range items {
			for _, ed := range childrenOf(spans, rd.SpanContext().SpanID(), "edge.deliver") {
				parents = append(parents, ed.Parent().SpanID())
			}
		}
		slices.SortFunc(parents, func(a, b trace.SpanID) int { return strings.Compare(a.String(), b.String()) })
		if len(slices.Compact(parents)) < 3 {
			t.Errorf("the edge's spans of three items have %d distinct router.deliver parents, want one each:%s", len(parents), describeSpans(spans))
		}
		for _, s := range spans {
			if s.Name() == "edge.deliver" && s.Parent().SpanID() == srv.SpanContext().SpanID() {
				t.Errorf("an edge.deliver is the batch's child, not its item's:%s", describeSpans(spans))
			}
		}
	})
}

// TestTraceAgentAnswerJoinsPhonesTrace: the phone's text reaches the event
// log with its traceparent (the edge's edge.event); an agent that sends it
// with its answer gets every call of /v1/sessions/… (messages, an edit,
// typing, avatar, a card and its closing, media) as a server span of the
// phone's trace, and each output's router.deliver and edge.deliver below
// it, so the phone's one trace goes phone → edge → router → event log →
// agent → router API → router → edge → phone.
func TestTraceAgentAnswerJoinsPhonesTrace(t *testing.T) {
	eachTracedEnv(t, func(t *testing.T, e *tracedEnv) {
		dev := device("tel")
		phone := e.phone(t, dev)
		if err := phone.Text("m-1", "hello agent"); err != nil {
			t.Fatal(err)
		}
		evs, _ := e.waitEvents(t, "", 1)
		ev := evs[0].Event
		if ev.TraceParent == "" {
			t.Fatalf("the event %+v carries no traceparent", ev)
		}
		phoneSpan := parseTraceParent(t, ev.TraceParent)
		e.waitSpans(t, phoneSpan.TraceID(), "edge.event of the phone's text", func(spans []sdktrace.ReadOnlySpan) bool {
			for _, s := range spans {
				if s.Name() == "edge.event" && s.SpanContext().SpanID() == phoneSpan.SpanID() {
					return true
				}
			}
			return false
		})

		session := "/v1/sessions/" + ev.Session
		say := func(method, path string, body any) map[string]any {
			t.Helper()
			return wantOK(t, e.callTraced(t, method, session+path, agentToken, ev.TraceParent, body))
		}
		say("POST", "/typing", nil)
		expect(t, phone, protocol.TypeTyping)
		id, _ := say("POST", "/messages", map[string]any{"text": "Hel", "final": false})["id"].(string)
		say("POST", "/messages", map[string]any{"id": id, "text": "Hello, phone", "edit": true})
		if text, _, err := phone.CollectMessage(ctxFor(t, 10*time.Second), id); err != nil || text != "Hello, phone" {
			t.Fatalf("the phone got %q, %v", text, err)
		}
		say("POST", "/avatar", map[string]any{"state": "speaking"})
		expect(t, phone, protocol.TypeAvatar)
		card, _ := say("POST", "/prompts", map[string]any{"kind": "slash_confirm", "text": "Proceed?"})["id"].(string)
		expect(t, phone, protocol.TypePrompt)
		say("DELETE", "/prompts/"+card, nil)
		expect(t, phone, protocol.TypePromptDone)
		say("POST", "/media", map[string]any{"id": "f-1", "kind": "image", "data": []byte("png bytes")})
		if _, _, err := phone.CollectMedia(ctxFor(t, 10*time.Second), "f-1"); err != nil {
			t.Fatal(err)
		}

		for _, c := range []struct{ span, op string }{
			{"POST /v1/sessions/{session}/typing", "typing"},
			{"POST /v1/sessions/{session}/messages", "message"},
			{"POST /v1/sessions/{session}/avatar", "avatar"},
			{"POST /v1/sessions/{session}/prompts", "prompt"},
			{"DELETE /v1/sessions/{session}/prompts/{id}", "prompt_done"},
			{"POST /v1/sessions/{session}/media", "media"},
		} {
			e.waitSpans(t, phoneSpan.TraceID(), c.span+" under the phone's edge.event, delivering "+c.op, func(spans []sdktrace.ReadOnlySpan) bool {
				for _, srv := range childrenOf(spans, phoneSpan.SpanID(), c.span) {
					if srv.SpanKind() == trace.SpanKindServer && deliveredUnder(spans, srv.SpanContext().SpanID(), c.op) {
						return true
					}
				}
				return false
			})
		}
		// Both parts of the message: an edit is a delivery of its own.
		spans := e.spansOf(phoneSpan.TraceID())
		messages := 0
		for _, srv := range childrenOf(spans, phoneSpan.SpanID(), "POST /v1/sessions/{session}/messages") {
			if deliveredUnder(spans, srv.SpanContext().SpanID(), "message") {
				messages++
			}
		}
		if messages != 2 {
			t.Errorf("%d message calls delivered in the phone's trace, want 2:%s", messages, describeSpans(spans))
		}
		if e.apiLogLine("POST", "/v1/sessions/{session}/messages", phoneSpan.TraceID()) == nil {
			t.Error("no api request line of the messages call carries the phone's trace_id")
		}
	})
}
