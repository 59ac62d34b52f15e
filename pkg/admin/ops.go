package admin

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// Ops is what a service runs beside its work: the admin port and the
// telemetry whose metrics it serves on /metrics.
type Ops struct {
	*Server
	Tel *telemetry.Telemetry
	log *slog.Logger
}

// StartOps starts the admin port on addr (MOBILE_ADMIN_LISTEN; "off" serves
// nothing), logging "admin listening" with its URL, and telemetry for
// service from the OTEL_* environment, whose SDK reports to log. The caller
// must Close it.
func StartOps(ctx context.Context, log *slog.Logger, addr, service string) (*Ops, error) {
	telemetry.SetLogger(log)
	adm := New(log.With("component", "admin"))
	if err := adm.Start(addr); err != nil {
		return nil, fmt.Errorf("MOBILE_ADMIN_LISTEN: %w", err)
	}
	if u := adm.URL(); u != "" {
		log.Info("admin listening", "url", u)
	}
	tel, err := telemetry.New(ctx, telemetry.FromEnv(service))
	if err != nil {
		adm.Close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	adm.Handle("GET /metrics", tel.Handler())
	return &Ops{Server: adm, Tel: tel, log: log}, nil
}

// Close flushes the telemetry and stops the admin port. A last export that
// fails (the collector is unreachable) is logged as a warning, not
// returned: the service did its job, and its exit code says so.
func (o *Ops) Close() error {
	if err := o.Tel.Close(); err != nil {
		o.log.Warn("telemetry: the last export failed; what it held is lost", "err", err)
	}
	return o.Server.Close()
}
