package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/hermes-mobile/gateway/pkg/telemetry"
)

// Ops is what a service runs beside its work: the admin port and the
// telemetry whose metrics it serves on /metrics.
type Ops struct {
	*Server
	Tel *telemetry.Telemetry
}

// StartOps starts the admin port on addr (MOBILE_ADMIN_LISTEN; "off" serves
// nothing), logging "admin listening" with its URL, and telemetry for
// service from the OTEL_* environment. The caller must Close it.
func StartOps(ctx context.Context, log *slog.Logger, addr, service string) (*Ops, error) {
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
	return &Ops{Server: adm, Tel: tel}, nil
}

// Close flushes the telemetry and stops the admin port.
func (o *Ops) Close() error {
	return errors.Join(o.Tel.Close(), o.Server.Close())
}
