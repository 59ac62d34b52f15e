package edge

import (
	"bytes"
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// edgeTelemetry is what the edge records: metrics on every frame, and a
// span per device event and per delivery when tracing is on. The metric
// calls allocate nothing; with tracing off no span is started.
type edgeTelemetry struct {
	m       *metrics
	process *telemetry.Metrics // nil-safe: the quota refusals
	tracer  trace.Tracer
	tracing bool
}

func newEdgeTelemetry(t *telemetry.Telemetry) edgeTelemetry {
	return edgeTelemetry{m: newMetrics(t.Meter()), process: t.Metrics(), tracer: t.Tracer("github.com/hermes-mobile/gateway/pkg/edge"), tracing: t.Tracing()}
}

// frameIn counts a message from the app by the type it decoded to.
func (t *edgeTelemetry) frameIn(f protocol.ClientFrame, invalid bool) {
	switch {
	case invalid:
		t.m.frameIn(frameInvalid)
	case f == nil:
		t.m.frameIn(frameUnknown)
	default:
		t.m.frameIn(f.Type())
	}
}

// frameOut counts a frame queued for the socket by its "t", read from the
// payload: every frame the edge builds starts with {"t":"<type>".
func (t *edgeTelemetry) frameOut(frame []byte) {
	if len(frame) < 2 || frame[0] != 0x81 { // FIN + text
		return
	}
	p := frame[2:]
	switch frame[1] & 0x7f {
	case 126:
		p = frame[min(4, len(frame)):]
	case 127:
		p = frame[min(10, len(frame)):]
	}
	const prefix = `{"t":"`
	if !bytes.HasPrefix(p, []byte(prefix)) {
		return
	}
	p = p[len(prefix):]
	if end := bytes.IndexByte(p, '"'); end > 0 {
		t.m.frameOutBytes(p[:end])
	}
}

// fatal counts a fatal error; before hello completed it is also a refused
// handshake, labelled with the code.
func (t *edgeTelemetry) fatal(c *conn, code protocol.Code) {
	c.mu.Lock()
	helloed := c.flags.is(flagHelloed)
	c.mu.Unlock()
	if !helloed {
		t.m.handshake(string(code))
	}
	t.m.error(string(code))
}

// startEvent starts the span of one device event (kind is wire.Event.Kind).
// Its context travels with the event to the router in the bus headers.
func (t *edgeTelemetry) startEvent(ctx context.Context, kind string) (context.Context, trace.Span) {
	if !t.tracing {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tracer.Start(ctx, "edge.event", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("hermes.event.kind", kind)))
}

// traceDelivery continues the trace of an output that arrived with header
// and ends its span when done runs, that is once the frames are written.
// traceparent is the output's own (wire.Output.TraceParent: one of a
// batch's outputs), which wins over the header's. The returned context is
// ctx with the span, for the delivery's work and log lines.
func (t *edgeTelemetry) traceDelivery(ctx context.Context, header map[string]string, traceparent, op string, done func(error)) (context.Context, func(error)) {
	if !t.tracing {
		return ctx, done
	}
	parent := telemetry.ExtractTraceParent(telemetry.Extract(ctx, header), traceparent)
	ctx, span := t.tracer.Start(parent, "edge.deliver", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("hermes.output.op", op)))
	return ctx, func(err error) {
		telemetry.EndSpan(span, err)
		done(err)
	}
}
