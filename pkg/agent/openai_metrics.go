package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// Results of one upstream call (the result label of
// hermes_agent_upstream_requests_total).
const (
	resultOK          = "ok"          // the stream ended as it should (or was cut at MaxAnswer)
	resultStatus      = "status"      // an answer other than 200
	resultUnreachable = "unreachable" // no answer: DNS, connection, TLS
	resultTimeout     = "timeout"     // nothing within FirstByte, or no end within Timeout
	resultStream      = "stream"      // a malformed, oversized or truncated stream, or an error event in it
	resultCanceled    = "canceled"    // the router ended the call: shutdown, a lost lease, the device's output failing
)

// resultError is an error of the upstream call labelled with its result.
type resultError struct {
	result string
	error
}

func (e resultError) Unwrap() error { return e.error }

// resultErrorf is fmt.Errorf labelled with result.
func resultErrorf(result, format string, a ...any) error {
	return resultError{result, fmt.Errorf(format, a...)}
}

// resultOf is the result label of the error a call ended with.
func resultOf(err error) string {
	var re resultError
	switch {
	case err == nil, errors.Is(err, errCut):
		return resultOK
	case errors.As(err, &re):
		return re.result
	}
	// The router ended the call's context (context.Canceled, its own
	// deadline, the device's output failing): the errors of the call
	// itself are labelled where they are made.
	return resultCanceled
}

// openaiMetrics are the OpenAI agent's instruments: its calls of the
// upstream by result, their duration and their time to the first byte.
// Every result is at 0 from the agent's start.
type openaiMetrics struct {
	calls     metric.Int64Counter
	duration  metric.Float64Histogram
	firstByte metric.Float64Histogram
	byResult  telemetry.LabelSet
}

// upstreamBuckets (seconds) run from a quick refusal to the 120 s an
// answer may take.
var upstreamBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120}

// newOpenAIMetrics creates the instruments on m (the no-op meter when nil).
// The names are constants, so an error is a bug, and it panics.
func newOpenAIMetrics(m metric.Meter) *openaiMetrics {
	if m == nil {
		m = metricnoop.NewMeterProvider().Meter("")
	}
	var x openaiMetrics
	var in telemetry.Instruments
	var e error
	x.calls, e = m.Int64Counter("hermes_agent_upstream_requests",
		metric.WithDescription("Calls of the OpenAI-compatible upstream (AGENT=openai), by result: ok, status, unreachable, timeout, stream, canceled."))
	in.Check(e)
	x.duration, e = m.Float64Histogram("hermes_agent_upstream_duration", metric.WithUnit("s"),
		metric.WithDescription("Calls of the OpenAI-compatible upstream, from the request until the stream ended or failed."),
		metric.WithExplicitBucketBoundaries(upstreamBuckets...))
	in.Check(e)
	x.firstByte, e = m.Float64Histogram("hermes_agent_upstream_first_byte", metric.WithUnit("s"),
		metric.WithDescription("Calls of the OpenAI-compatible upstream, from the request until the first line of its stream."),
		metric.WithExplicitBucketBoundaries(upstreamBuckets...))
	in.Check(e)
	if err := in.Err(); err != nil {
		panic(fmt.Sprintf("agent: creating the instruments: %v", err))
	}
	x.byResult = telemetry.NewLabelSet("result", resultOK, resultStatus, resultUnreachable, resultTimeout, resultStream, resultCanceled)
	for _, opts := range x.byResult.Known() {
		x.calls.Add(context.Background(), 0, opts...)
	}
	return &x
}

// call records a call begun at start that ended with err.
func (m *openaiMetrics) call(start time.Time, err error) {
	ctx := context.Background()
	m.calls.Add(ctx, 1, m.byResult.Of(resultOf(err))...)
	m.duration.Record(ctx, time.Since(start).Seconds())
}

// firstLine records a call begun at start whose stream's first line came.
func (m *openaiMetrics) firstLine(start time.Time) {
	m.firstByte.Record(context.Background(), time.Since(start).Seconds())
}
