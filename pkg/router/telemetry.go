package router

import (
	"context"

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

// withParent returns ctx whose span is parent, when parent is set: a queued
// event's handling continues the trace of the message that brought it.
func withParent(ctx context.Context, parent trace.SpanContext) context.Context {
	if !parent.IsValid() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, parent)
}
