package telemetry

import (
	"context"
	"net/http"

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

// ExtractHTTP returns ctx carrying the remote span context that an HTTP
// request's W3C traceparent (and tracestate) headers name, or ctx itself
// when they name none: the caller's span becomes the parent of the
// server's.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	if len(h["Traceparent"]) == 0 { // the canonical key: no allocation
		return ctx
	}
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// ExtractTraceParent returns ctx carrying the remote span context that
// traceparent, a W3C traceparent value a message carries in its body (one
// of several outputs that share a bus message), names; ctx itself when it
// is empty or not a valid traceparent.
func ExtractTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagator.Extract(ctx, traceParentCarrier(traceparent))
}

// traceParentCarrier is a carrier holding one traceparent value, without
// the map a MapCarrier would allocate.
type traceParentCarrier string

func (c traceParentCarrier) Get(key string) string {
	if key == "traceparent" {
		return string(c)
	}
	return ""
}

func (traceParentCarrier) Set(string, string) {}

func (traceParentCarrier) Keys() []string { return []string{"traceparent"} }
