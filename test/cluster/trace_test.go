//go:build unix

package cluster

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestTraceFromCallerToPhone runs an edge and a router as processes that
// export their spans over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT) to a
// loopback sink, as an operator wiring the gateway into OpenTelemetry
// would, and checks the traces the sink gets:
//
//   - a POST /v1/deliver with a caller's traceparent is the router's
//     server span, whose parent is the caller's span, and the delivery's
//     router.deliver and the edge's edge.deliver are in the caller's
//     trace below it;
//   - an outside agent (AGENT=link) that answers the phone's text with
//     POST /v1/sessions/{session}/messages and the event's traceparent has
//     its answer written by an edge.deliver in the phone's trace, the one
//     of the phone's edge.event, through the router's server span.
func TestTraceFromCallerToPhone(t *testing.T) {
	sink := newOTLPSink(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + sink.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}
	c := newCluster(t, options{routerEnv: append([]string{"AGENT=link"}, otel...)})
	c.startEdge(t, "T", otel...)
	dev := newDevice("trace")
	phone := c.connect(t, "T", dev)

	t.Run("deliver", func(t *testing.T) {
		// Cron, or any caller, with a trace of its own.
		caller := fmt.Sprintf("00-%s-%s-01", testsvc.RandomHex(16), testsvc.RandomHex(8))
		callerTrace, callerSpan := traceParentIDs(t, caller)
		code, body := c.postTraced(t, "/v1/deliver", c.deliverToken, caller, map[string]any{"target": dev, "id": "d-1", "text": "from cron"})
		if code != http.StatusOK {
			t.Fatalf("deliver: %d %v", code, body)
		}
		readUntil(t, phone, "the delivery", finalText("from cron"))
		srv := sink.wait(t, "the router's POST /v1/deliver span under the caller's, and an edge.deliver below it", func(s *otlpSpans) *otlpSpan {
			for _, srv := range s.children(callerTrace, callerSpan, "POST /v1/deliver") {
				if srv.kind == tracepb.Span_SPAN_KIND_SERVER && srv.service == "hermes-router" && s.delivered(srv, "message") {
					return srv
				}
			}
			return nil
		})
		t.Logf("caller %s → %s %s (%s)", caller, srv.name, srv.id, srv.service)
	})

	t.Run("agent answer", func(t *testing.T) {
		// The phone's text, the event log, and the agent's answer.
		if err := phone.Text("m-1", "hello agent"); err != nil {
			t.Fatal(err)
		}
		ev := c.waitEvent(t, dev, "m-1")
		if ev.TraceParent == "" {
			t.Fatalf("the event %+v carries no traceparent", ev)
		}
		phoneTrace, phoneSpan := traceParentIDs(t, ev.TraceParent)
		code, body := c.postTraced(t, "/v1/sessions/"+ev.Session+"/messages", c.agentToken, ev.TraceParent, map[string]any{"id": "a-1", "text": "hello phone", "final": true})
		if code != http.StatusOK {
			t.Fatalf("agent message: %d %v", code, body)
		}
		readUntil(t, phone, "the agent's answer", finalText("hello phone"))
		sink.wait(t, "the phone's edge.event", func(s *otlpSpans) *otlpSpan {
			if sp := s.span(phoneTrace, phoneSpan); sp != nil && sp.name == "edge.event" && sp.service == "hermes-edge" {
				return sp
			}
			return nil
		})
		srv := sink.wait(t, "the router's messages span under the phone's edge.event, and an edge.deliver below it", func(s *otlpSpans) *otlpSpan {
			for _, srv := range s.children(phoneTrace, phoneSpan, "POST /v1/sessions/{session}/messages") {
				if srv.kind == tracepb.Span_SPAN_KIND_SERVER && s.delivered(srv, "message") {
					return srv
				}
			}
			return nil
		})
		t.Logf("phone's edge.event %s → %s %s", ev.TraceParent, srv.name, srv.id)
	})
}

// postTraced is post with a traceparent header.
func (c *cluster) postTraced(t *testing.T, path, token, traceparent string, body any) (int, map[string]any) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, c.routerURL+path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// waitEvent reads the router's event log (AGENT=link) until the event of
// dev's message id comes, for 15 s.
func (c *cluster) waitEvent(t *testing.T, dev, id string) wire.Event {
	t.Helper()
	cursor := ""
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, c.routerURL+"/v1/events?wait=5&cursor="+url.QueryEscape(cursor), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+c.agentToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Events []struct {
				Event wire.Event `json:"event"`
			} `json:"events"`
			Cursor string `json:"cursor"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/events: %d %v", resp.StatusCode, err)
		}
		for _, e := range page.Events {
			if e.Event.Device == dev && e.Event.ID == id {
				return e.Event
			}
		}
		cursor = page.Cursor
	}
	t.Fatalf("no event of %s's message %s in the log within 15 s", dev, id)
	return wire.Event{}
}

// traceParentIDs returns the trace and span id, in hex, of a W3C
// traceparent.
func traceParentIDs(t *testing.T, tp string) (traceID, spanID string) {
	t.Helper()
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		t.Fatalf("traceparent %q is not version-trace-span-flags", tp)
	}
	return parts[1], parts[2]
}

// otlpSink is a loopback OTLP/HTTP collector keeping the spans it gets.
type otlpSink struct {
	*httptest.Server
	mu    sync.Mutex
	spans otlpSpans
}

// otlpSpan is a span as the sink got it; ids in hex.
type otlpSpan struct {
	trace, id, parent string
	name, service     string
	kind              tracepb.Span_SpanKind
	attrs             map[string]string
}

// otlpSpans are the spans the sink got, in arrival order.
type otlpSpans []*otlpSpan

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			w.WriteHeader(http.StatusOK) // metrics: not looked at
			return
		}
		var rd io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rd = gz
		}
		data, err := io.ReadAll(rd)
		var req coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &req)
		}
		if err != nil {
			t.Errorf("the sink got a traces export it cannot decode: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.add(&req)
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *otlpSink) add(req *coltrace.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := make(map[string]string)
				for _, kv := range sp.GetAttributes() {
					v := kv.GetValue()
					if v.GetStringValue() != "" {
						attrs[kv.GetKey()] = v.GetStringValue()
					} else {
						attrs[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
					}
				}
				s.spans = append(s.spans, &otlpSpan{
					trace: hex.EncodeToString(sp.GetTraceId()), id: hex.EncodeToString(sp.GetSpanId()),
					parent: hex.EncodeToString(sp.GetParentSpanId()), name: sp.GetName(), service: service,
					kind: sp.GetKind(), attrs: attrs,
				})
			}
		}
	}
}

// wait waits up to 20 s for find to find a span among those the sink got,
// and returns it; the test fails listing them if it does not.
func (s *otlpSink) wait(t *testing.T, what string, find func(*otlpSpans) *otlpSpan) *otlpSpan {
	t.Helper()
	var found *otlpSpan
	testsvc.Eventually(20*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		found = find(&s.spans)
		return found != nil
	})
	if found == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		var b strings.Builder
		for _, sp := range s.spans {
			if sp.name != "edge.event" && !strings.HasPrefix(sp.name, "router.") && !strings.HasPrefix(sp.name, "edge.") && sp.kind != tracepb.Span_SPAN_KIND_SERVER {
				continue // Redis commands
			}
			fmt.Fprintf(&b, "\n  %s %s %s (%s, %s) parent %s", sp.trace, sp.id, sp.name, sp.kind, sp.service, sp.parent)
		}
		t.Fatalf("the OTLP sink got no %s within 20 s; it got:%s", what, b.String())
	}
	return found
}

// span returns the span id of trace, or nil.
func (s *otlpSpans) span(trace, id string) *otlpSpan {
	for _, sp := range *s {
		if sp.trace == trace && sp.id == id {
			return sp
		}
	}
	return nil
}

// children returns the spans of trace named name whose parent is parent.
func (s *otlpSpans) children(trace, parent, name string) []*otlpSpan {
	var out []*otlpSpan
	for _, sp := range *s {
		if sp.trace == trace && sp.parent == parent && sp.name == name {
			out = append(out, sp)
		}
	}
	return out
}

// delivered reports whether a router.deliver child of srv (the router's)
// has an edge.deliver child of op (the edge's).
func (s *otlpSpans) delivered(srv *otlpSpan, op string) bool {
	for _, rd := range s.children(srv.trace, srv.id, "router.deliver") {
		if rd.service != "hermes-router" {
			continue
		}
		for _, ed := range s.children(srv.trace, rd.id, "edge.deliver") {
			if ed.service == "hermes-edge" && ed.attrs["hermes.output.op"] == op {
				return true
			}
		}
	}
	return false
}
