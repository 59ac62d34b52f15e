// Package telemetry sets up what a node reports about itself: OpenTelemetry
// traces and metrics, a Prometheus /metrics handler, and OTLP export (over
// HTTP or gRPC, OTEL_EXPORTER_OTLP_PROTOCOL) when OTEL_EXPORTER_OTLP_ENDPOINT
// or a signal's own OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT is set.
//
// Metrics always go to a private Prometheus registry, which also holds the
// Go and process collectors (go_goroutines, process_resident_memory_bytes).
// Traces are recorded only when there is somewhere to send them (an OTLP
// endpoint, or a span processor given in Config); otherwise the tracer is
// the no-op one and a span costs nothing beyond passing a context along.
//
// Trace context crosses the bus as W3C traceparent headers: natsbus injects
// it on Publish and Request, and handlers continue it with Extract. Frame
// contents and tokens are never put in spans or metric attributes.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Env vars read by FromEnv (the standard OpenTelemetry names).
const (
	EnvEndpoint         = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint   = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvMetricsEndpoint  = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
	EnvProtocol         = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol   = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvMetricsProtocol  = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
	EnvServiceName      = "OTEL_SERVICE_NAME"
	ProtocolHTTP        = "http/protobuf" // the default
	ProtocolGRPC        = "grpc"
	defaultOTLPProtocol = ProtocolHTTP
)

// Config of a node's telemetry.
type Config struct {
	// ServiceName is the service.name resource attribute (OTEL_SERVICE_NAME
	// wins over it, as the OpenTelemetry spec says).
	ServiceName string
	// Endpoint is the OTLP base URL (OTEL_EXPORTER_OTLP_ENDPOINT), e.g.
	// http://collector:4318: over HTTP traces go to /v1/traces and metrics
	// to /v1/metrics under it; over gRPC both go to it. Empty, with no
	// signal's own endpoint: no OTLP export.
	Endpoint string
	// TracesEndpoint and MetricsEndpoint, when set, are the URLs of one
	// signal (OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT), used as they
	// are, and win over Endpoint for it.
	TracesEndpoint, MetricsEndpoint string
	// Protocol is the OTLP transport (OTEL_EXPORTER_OTLP_PROTOCOL):
	// ProtocolHTTP (empty) or ProtocolGRPC; TracesProtocol and
	// MetricsProtocol (OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL) win
	// over it for their signal.
	Protocol, TracesProtocol, MetricsProtocol string
	// SpanProcessor, when set, receives every span as well (tests use an
	// in-memory recorder). It turns tracing on like an endpoint does.
	SpanProcessor sdktrace.SpanProcessor
}

// FromEnv is the Config of a service named service, with the endpoints and
// protocols from the OTEL_EXPORTER_OTLP_* variables.
func FromEnv(service string) Config {
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	return Config{ServiceName: service, Endpoint: env(EnvEndpoint),
		TracesEndpoint: env(EnvTracesEndpoint), MetricsEndpoint: env(EnvMetricsEndpoint),
		Protocol: env(EnvProtocol), TracesProtocol: env(EnvTracesProtocol), MetricsProtocol: env(EnvMetricsProtocol)}
}

// otlpTarget is where one signal is exported: its endpoint ("" for none)
// and protocol.
type otlpTarget struct{ endpoint, protocol string }

// target resolves signal ("traces" or "metrics") from own (its own
// endpoint and protocol) and the shared settings. A protocol other than
// http/protobuf or grpc is an error naming its variable.
func (c Config) target(signal, own, ownProtocol, ownProtocolVar string) (otlpTarget, error) {
	t := otlpTarget{protocol: defaultOTLPProtocol}
	switch {
	case ownProtocol != "":
		t.protocol = ownProtocol
	case c.Protocol != "":
		t.protocol, ownProtocolVar = c.Protocol, EnvProtocol
	}
	if t.protocol != ProtocolHTTP && t.protocol != ProtocolGRPC {
		return t, fmt.Errorf("%s: %q is not %s or %s", ownProtocolVar, t.protocol, ProtocolHTTP, ProtocolGRPC)
	}
	switch {
	case own != "":
		t.endpoint = own
	case c.Endpoint != "" && t.protocol == ProtocolHTTP:
		t.endpoint = signalURL(c.Endpoint, signal)
	default:
		t.endpoint = c.Endpoint
	}
	return t, nil
}

func (c Config) traces() (otlpTarget, error) {
	return c.target("traces", c.TracesEndpoint, c.TracesProtocol, EnvTracesProtocol)
}

func (c Config) metrics() (otlpTarget, error) {
	return c.target("metrics", c.MetricsEndpoint, c.MetricsProtocol, EnvMetricsProtocol)
}

// traceExporter is the OTLP span exporter of t.
func traceExporter(ctx context.Context, t otlpTarget) (sdktrace.SpanExporter, error) {
	if t.protocol == ProtocolGRPC {
		if hasScheme(t.endpoint) {
			return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(t.endpoint))
		}
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(t.endpoint))
	}
	return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(t.endpoint))
}

// metricExporter is the OTLP metric exporter of t.
func metricExporter(ctx context.Context, t otlpTarget) (sdkmetric.Exporter, error) {
	if t.protocol == ProtocolGRPC {
		if hasScheme(t.endpoint) {
			return otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpointURL(t.endpoint))
		}
		return otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpoint(t.endpoint))
	}
	return otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(t.endpoint))
}

// hasScheme: a gRPC endpoint may be a URL (http:// is plaintext) or a bare
// host:port (TLS unless OTEL_EXPORTER_OTLP_INSECURE=true).
func hasScheme(endpoint string) bool { return strings.Contains(endpoint, "://") }

// Telemetry is a node's tracer and meter providers, its Prometheus registry
// and the process-wide instruments. A nil *Telemetry is valid: it traces with
// the no-op tracer and records no metrics.
type Telemetry struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	registry       *prometheus.Registry
	metrics        *Metrics
	tracing        bool // spans are recorded (an exporter or processor is set)
	shutdown       []func(context.Context) error
}

// New sets up telemetry as cfg says. The caller must Shutdown it, which
// flushes what the exporters still hold.
func New(ctx context.Context, cfg Config) (_ *Telemetry, err error) {
	t := &Telemetry{registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			_ = t.Shutdown(context.WithoutCancel(ctx)) // err is already the answer
		}
	}()
	if err := t.registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if err := t.registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	if err := t.registry.Register(buildInfo(cfg.ServiceName)); err != nil {
		return nil, err
	}
	res, err := newResource(ctx, cfg.ServiceName)
	if err != nil {
		return nil, err
	}

	promExp, err := otelprom.New(otelprom.WithRegisterer(t.registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	mt, err := cfg.metrics()
	if err != nil {
		return nil, err
	}
	tt, err := cfg.traces()
	if err != nil {
		return nil, err
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	if mt.endpoint != "" {
		exp, err := metricExporter(ctx, mt)
		if err != nil {
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	t.meterProvider = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)

	if tt.endpoint == "" && cfg.SpanProcessor == nil {
		t.tracerProvider = noop.NewTracerProvider()
	} else {
		topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		if tt.endpoint != "" {
			exp, err := traceExporter(ctx, tt)
			if err != nil {
				return nil, err
			}
			topts = append(topts, sdktrace.WithBatcher(exp))
		}
		if cfg.SpanProcessor != nil {
			topts = append(topts, sdktrace.WithSpanProcessor(cfg.SpanProcessor))
		}
		tp := sdktrace.NewTracerProvider(topts...)
		t.tracing = true
		t.tracerProvider = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}

	if t.metrics, err = newMetrics(mp.Meter(instrumentationName)); err != nil {
		return nil, err
	}
	return t, nil
}

// instrumentationName names the gateway's meter and tracers.
const instrumentationName = "github.com/hermes-mobile/gateway"

// signalURL is the OTLP/HTTP URL of one signal under a base endpoint.
func signalURL(base, signal string) string {
	return strings.TrimRight(base, "/") + "/v1/" + signal
}

func newResource(ctx context.Context, service string) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{
		attribute.String("service.version", ReadBuild().Version),
		attribute.String("service.instance.id", instanceID),
	}
	if service != "" {
		attrs = append(attrs, attribute.String("service.name", service))
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the built-in name.
	return resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...), resource.WithFromEnv())
}

// Tracer returns the tracer for the part of the gateway called name (the
// no-op tracer on a nil Telemetry).
func (t *Telemetry) Tracer(name string) trace.Tracer {
	if t == nil {
		return noop.NewTracerProvider().Tracer(name)
	}
	return t.tracerProvider.Tracer(name)
}

// Tracing reports whether spans are recorded; without, instrumented code
// may skip starting them.
func (t *Telemetry) Tracing() bool { return t != nil && t.tracing }

// TracerProvider is the provider behind Tracer.
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if t == nil {
		return noop.NewTracerProvider()
	}
	return t.tracerProvider
}

// Meter is the meter the edge and the router create their instruments on
// (the no-op meter on a nil Telemetry).
func (t *Telemetry) Meter() metric.Meter {
	if t == nil {
		return metricnoop.NewMeterProvider().Meter(instrumentationName)
	}
	return t.meterProvider.Meter(instrumentationName)
}

// Metrics returns the process-wide instruments (NATS, Redis, the HTTP
// API); nil (every method a no-op) on a nil Telemetry.
func (t *Telemetry) Metrics() *Metrics {
	if t == nil {
		return nil
	}
	return t.metrics
}

// Handler serves the Prometheus text format of every metric: the gateway's
// and the Go and process collectors'.
func (t *Telemetry) Handler() http.Handler {
	if t == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{})
}

// CloseTimeout bounds Close.
const CloseTimeout = 5 * time.Second

// Close is Shutdown bounded by CloseTimeout, for a service's deferred
// clean-up (its own context is done by then).
func (t *Telemetry) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
	defer cancel()
	return t.Shutdown(ctx)
}

// Shutdown flushes and stops the exporters. Spans and metrics recorded
// afterwards are dropped.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}

// EndSpan ends span, marking it failed when err is set.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
