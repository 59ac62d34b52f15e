package telemetry

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel"
)

// TestSetLoggerRoutesSDKErrors: an error the SDK reports (otel.Handle, as a
// failed export does) becomes a JSON warning in the process's log.
func TestSetLoggerRoutesSDKErrors(t *testing.T) {
	var buf bytes.Buffer
	SetLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() { SetLogger(slog.New(slog.DiscardHandler)) })
	otel.Handle(errors.New("export refused"))
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("the log is not one JSON line: %q", buf.String())
	}
	if rec["level"] != "WARN" || rec["err"] != "export refused" || rec["component"] != "otel" {
		t.Errorf("logged %v, want a WARN with err export refused and component otel", rec)
	}
}
