package router

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// routerTelemetry is what the router records: delivery latency and outbox
// counts, and, when tracing is on, spans that continue the edge's trace of
// an event through the agent call and each delivery back.
type routerTelemetry struct {
	m       *metrics
	process *telemetry.Metrics // nil-safe: the HTTP API's
	tracer  trace.Tracer
	tracing bool
}

func newRouterTelemetry(t *telemetry.Telemetry) routerTelemetry {
	return routerTelemetry{m: newMetrics(t.Meter()), process: t.Metrics(), tracer: t.Tracer("github.com/hermes-mobile/gateway/pkg/router"), tracing: t.Tracing()}
}

// startEvent continues the trace that m's headers carry, for taking one
// device event off the bus.
func (t *routerTelemetry) startEvent(ctx context.Context, m *bus.Msg) (context.Context, trace.Span) {
	if !t.tracing {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tracer.Start(telemetry.Extract(ctx, m.Header), "router.event", trace.WithSpanKind(trace.SpanKindConsumer))
}

// start starts a span named name under ctx's span; kind is the event kind
// or output op.
func (t *routerTelemetry) start(ctx context.Context, name, kind string) (context.Context, trace.Span) {
	if !t.tracing {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tracer.Start(ctx, name, trace.WithAttributes(attribute.String("hermes.kind", kind)))
}

// startRequest starts the server span of one request to the API, which
// continues the caller's trace when the request carries a W3C traceparent
// (telemetry.StartServerSpan), and returns the request with it: what the
// endpoint does (deliveries, their router.deliver and the edges'
// edge.deliver spans, Redis commands, log lines) is in that trace. Without
// tracing it returns req and a nil span, at no cost.
func (t *routerTelemetry) startRequest(req *http.Request) (*http.Request, trace.Span) {
	if !t.tracing {
		return req, nil
	}
	ctx, span := telemetry.StartServerSpan(req.Context(), t.tracer, req)
	return req.WithContext(ctx), span
}

// deliverTracer is the tracer of the API's dispatch.Deliverer: nil (no
// spans) without tracing.
func (t *routerTelemetry) deliverTracer() trace.Tracer {
	if !t.tracing {
		return nil
	}
	return t.tracer
}

// withParent returns ctx whose span is parent, when parent is set: a queued
// event's handling continues the trace of the message that brought it.
func withParent(ctx context.Context, parent trace.SpanContext) context.Context {
	if !parent.IsValid() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, parent)
}
