package telemetry

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// SetLogger sends what the OpenTelemetry SDK reports (a failed export, a
// dropped span) to log, so the process's log stays JSON; by default the
// SDK prints plain text to stderr. Export errors are warnings: telemetry
// that cannot be delivered does not stop the service. It is process-wide,
// like the SDK's handlers.
func SetLogger(log *slog.Logger) {
	log = log.With("component", "otel")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("telemetry export failed", "err", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(otelLevels{log.Handler()}))
}

// otelLevels maps the logr verbosity the SDK logs at (1 warn, 4 info,
// 8 debug), which logr hands to slog as -1, -4 and -8, to slog's levels.
// The SDK's info ("MeterProvider created") is debug here.
type otelLevels struct{ h slog.Handler }

func otelLevel(l slog.Level) slog.Level {
	switch {
	case l >= slog.LevelInfo:
		return l // errors
	case l >= -1:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

func (o otelLevels) Enabled(ctx context.Context, l slog.Level) bool {
	return o.h.Enabled(ctx, otelLevel(l))
}

func (o otelLevels) Handle(ctx context.Context, r slog.Record) error {
	r.Level = otelLevel(r.Level)
	return o.h.Handle(ctx, r)
}

func (o otelLevels) WithAttrs(attrs []slog.Attr) slog.Handler {
	return otelLevels{o.h.WithAttrs(attrs)}
}

func (o otelLevels) WithGroup(name string) slog.Handler { return otelLevels{o.h.WithGroup(name)} }

// LogHandler wraps h so that every record made with a context that carries
// a span (log.InfoContext(ctx, …) and the like) also carries the span's
// trace_id and span_id, as hex, so that a log line leads to its trace.
// Records without a span pass through unchanged.
func LogHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone() // r's attributes may be shared with other handlers
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
