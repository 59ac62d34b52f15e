package telemetry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// TestServerSpan: a request with a traceparent header is a server span
// whose parent is the caller's span, named "{method} {route}" once the
// route is known, with the route and status and never the path; a 5xx
// marks it failed, a 4xx does not; a request without the header, or with
// a broken one, starts a trace; an unknown route leaves the method alone.
func TestServerSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "x", SpanProcessor: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	tracer := tel.Tracer("x")
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	for _, tc := range []struct {
		name, method, header, route string
		status                      int
		wantName                    string
		wantParent                  bool
		wantError                   bool
	}{
		{"continued", "POST", caller, "/v1/sessions/{session}/messages", 200, "POST /v1/sessions/{session}/messages", true, false},
		{"no header", "POST", "", "/v1/deliver", 0, "POST /v1/deliver", false, false},
		{"broken header", "POST", "00-zz-00f067aa0ba902b7-01", "/v1/deliver", 404, "POST /v1/deliver", false, false},
		{"server error", "GET", caller, "/readyz", 503, "GET /readyz", true, true},
		{"unknown route", "GET", caller, telemetry.RouteOther, 404, "GET", true, false},
		{"unknown method", "BREW", "", "/v1/deliver", 405, "HTTP /v1/deliver", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "/v1/sessions/mobile:tel-secret/messages?cursor=c", nil)
			if tc.header != "" {
				req.Header.Set("traceparent", tc.header)
			}
			ctx, span := telemetry.StartServerSpan(req.Context(), tracer, req)
			if trace.SpanFromContext(ctx) != span {
				t.Error("the returned context does not carry the span")
			}
			telemetry.EndServerSpan(span, tc.method, tc.route, tc.status)
			ended := rec.Ended()
			s := ended[len(ended)-1]
			if s.Name() != tc.wantName || s.SpanKind() != trace.SpanKindServer {
				t.Errorf("span %q (%s), want %q (server)", s.Name(), s.SpanKind(), tc.wantName)
			}
			if got := s.Parent().IsValid(); got != tc.wantParent {
				t.Errorf("has a parent: %v, want %v", got, tc.wantParent)
			}
			if tc.wantParent && (s.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
				s.Parent().SpanID().String() != "00f067aa0ba902b7" || !s.Parent().IsRemote()) {
				t.Errorf("parent %v, want the caller's remote span", s.Parent())
			}
			if got := s.Status().Code == codes.Error; got != tc.wantError {
				t.Errorf("failed: %v, want %v", got, tc.wantError)
			}
			attrs := map[string]string{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
				if v := a.Value.String(); strings.Contains(v, "tel-secret") || strings.Contains(v, "cursor") {
					t.Errorf("attribute %s = %q names the path or the query", a.Key, v)
				}
			}
			status := tc.status
			if status == 0 {
				status = http.StatusOK
			}
			if attrs["http.response.status_code"] != strconv.Itoa(status) || attrs["url.scheme"] != "http" || attrs["http.request.method"] == "" {
				t.Errorf("attributes %v", attrs)
			}
			if _, ok := attrs["http.route"]; ok != (tc.route != telemetry.RouteOther) {
				t.Errorf("attributes %v: http.route only for a known route", attrs)
			}
		})
	}
}

// TestExtractTraceParent: a valid traceparent value becomes the remote
// parent; an empty or broken one leaves the context as it was.
func TestExtractTraceParent(t *testing.T) {
	base := telemetry.Extract(context.Background(), map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"})
	for tp, want := range map[string]string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": "00f067aa0ba902b7",
		"":            "2222222222222222",
		"not-a-trace": "2222222222222222",
	} {
		sc := trace.SpanContextFromContext(telemetry.ExtractTraceParent(base, tp))
		if sc.SpanID().String() != want || !sc.IsRemote() {
			t.Errorf("ExtractTraceParent(%q): span %s, want %s", tp, sc.SpanID(), want)
		}
	}
}
