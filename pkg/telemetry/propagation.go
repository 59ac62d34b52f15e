package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is the W3C trace context (traceparent, tracestate).
var propagator = propagation.TraceContext{}

// Inject returns header with the trace context of ctx added, copying it
// first; header itself when ctx carries no span, so untraced messages cost
// nothing.
func Inject(ctx context.Context, header map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return header
	}
	h := make(map[string]string, len(header)+2)
	for k, v := range header {
		h[k] = v
	}
	propagator.Inject(ctx, propagation.MapCarrier(h))
	return h
}

// Extract returns ctx carrying the remote span context found in header (a
// bus message's), or ctx itself when there is none.
func Extract(ctx context.Context, header map[string]string) context.Context {
	if len(header) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(header))
}

// TraceParent returns the W3C traceparent of ctx's span, or "" when ctx
// carries none, for messages that name their trace in their body.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c.Get("traceparent")
}
