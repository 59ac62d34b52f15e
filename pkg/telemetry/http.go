package telemetry

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/httpconv"
	"go.opentelemetry.io/otel/trace"
)

// HTTPServer records the requests of one HTTP server: the count by route,
// method and status class (hermes_http_requests_total), and their duration
// as the OpenTelemetry semantic conventions name it
// (http.server.request.duration, with http.request.method, http.route,
// http.response.status_code and url.scheme). Its methods are safe on a nil
// *HTTPServer.
type HTTPServer struct {
	requests metric.Int64Counter
	duration httpconv.ServerRequestDuration
	routes   map[string]bool

	mu    sync.RWMutex
	count map[httpKey][]metric.AddOption // built as combinations are first seen
	durs  map[durKey]attribute.Set       // the same, for the duration
}

type httpKey struct{ route, method, class string }

// durKey is a duration's attributes: route is "" when the request matched
// none of the server's routes (the conventions leave http.route out then).
type durKey struct {
	route  string
	method httpconv.RequestMethodAttr
	status int
}

// RouteOther is the route label of a request that matched none of the
// server's routes.
const RouteOther = "other"

// statusClasses are zeroed for every route; 1xx and 3xx are not answers
// the servers give.
var statusClasses = []string{"2xx", "4xx", "5xx"}

// HTTPServer returns the recorder of a server whose routes (path patterns
// as http.ServeMux has them) answer the given methods. Each route with each
// of its methods and the classes 2xx, 4xx and 5xx is a series at 0 from
// now on.
func (m *Metrics) HTTPServer(routes map[string][]string) *HTTPServer {
	if m == nil {
		return nil
	}
	h := &HTTPServer{requests: m.httpRequests, duration: m.httpDuration,
		routes: make(map[string]bool, len(routes)), count: make(map[httpKey][]metric.AddOption),
		durs: make(map[durKey]attribute.Set)}
	for route, methods := range routes {
		h.routes[route] = true
		for _, method := range methods {
			for _, class := range statusClasses {
				h.requests.Add(bg, 0, h.countOpts(httpKey{route, method, class})...)
			}
		}
	}
	return h
}

// countOpts returns the counter's options for k, building them once.
func (h *HTTPServer) countOpts(k httpKey) []metric.AddOption {
	return memo(&h.mu, h.count, k, func() []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("route", k.route), attribute.String("method", k.method), attribute.String("status_class", k.class)))}
	})
}

// memo returns m[k], built by build and kept under mu the first time k
// is asked for: the attributes of a request are built once per
// combination, not per request.
func memo[K comparable, V any](mu *sync.RWMutex, m map[K]V, k K, build func() V) V {
	mu.RLock()
	v, ok := m[k]
	mu.RUnlock()
	if ok {
		return v
	}
	v = build()
	mu.Lock()
	m[k] = v
	mu.Unlock()
	return v
}

// Request records one request to route (its pattern; a route the server
// did not name is RouteOther) with method, answered status after d.
// Status 0 (nothing written) is the 200 net/http sends.
func (h *HTTPServer) Request(route, method string, status int, d time.Duration) {
	if h == nil {
		return
	}
	if status == 0 {
		status = http.StatusOK
	}
	matched := h.routes[route]
	if !matched {
		route = RouteOther
	}
	m := normalMethod(method)
	h.requests.Add(bg, 1, h.countOpts(httpKey{route, string(m), statusClass(status)})...)
	k := durKey{method: m, status: status}
	if matched {
		k.route = route
	}
	h.duration.RecordSet(bg, d.Seconds(), h.durSet(k))
}

// durSet returns the duration's attribute set for k, building it once
// (building it per request was a twentieth of a router's CPU at 10,000
// deliveries a second). The statuses are the handlers' own, so the sets
// are few.
func (h *HTTPServer) durSet(k durKey) attribute.Set {
	return memo(&h.mu, h.durs, k, func() attribute.Set {
		attrs := []attribute.KeyValue{semconv.HTTPResponseStatusCode(k.status),
			semconv.HTTPRequestMethodKey.String(string(k.method)), semconv.URLScheme("http")}
		if k.route != "" {
			attrs = append(attrs, semconv.HTTPRoute(k.route))
		}
		return attribute.NewSet(attrs...)
	})
}

// normalMethod is method if it is one HTTP defines, else "_OTHER" (as the
// semantic conventions say), so that a client cannot add series.
func normalMethod(method string) httpconv.RequestMethodAttr {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return httpconv.RequestMethodAttr(method)
	}
	return httpconv.RequestMethodOther
}

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

// StartServerSpan starts, on tracer, the server span of one request to an
// HTTP server: it continues the trace that the request's W3C traceparent
// header names (the caller's span is its parent), or starts one. It is
// named after the method until EndServerSpan names it after the route,
// as the semantic conventions name server spans ("POST /v1/deliver"). It
// carries http.request.method and url.scheme, and EndServerSpan adds
// http.route and http.response.status_code; never the path (it names
// devices), the query or the headers (tokens).
func StartServerSpan(ctx context.Context, tracer trace.Tracer, req *http.Request) (context.Context, trace.Span) {
	m := string(normalMethod(req.Method))
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	return tracer.Start(ExtractHTTP(ctx, req.Header), serverSpanName(m, ""), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(m), semconv.URLScheme(scheme)))
}

// EndServerSpan ends span, a StartServerSpan's, for a request with method
// that matched route (a path pattern; "" or RouteOther for none) and was
// answered status (0: nothing written, net/http's 200). A 5xx marks it
// failed; a 4xx is the client's error, not the server's.
func EndServerSpan(span trace.Span, method, route string, status int) {
	if status == 0 {
		status = http.StatusOK
	}
	if route != "" && route != RouteOther {
		span.SetName(serverSpanName(string(normalMethod(method)), route))
		span.SetAttributes(semconv.HTTPRoute(route), semconv.HTTPResponseStatusCode(status))
	} else {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// serverSpanName is "{method} {route}", or the method alone without a
// route; "HTTP" stands for a method HTTP does not define.
func serverSpanName(method, route string) string {
	if method == string(httpconv.RequestMethodOther) {
		method = "HTTP"
	}
	if route == "" {
		return method
	}
	return method + " " + route
}
