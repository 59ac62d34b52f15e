package natsbus

import (
	"fmt"
	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded starts a nats-server in this process, with no listener (no port
// is opened), and returns a Bus connected to it in-process. Server returns
// that server, for ConnectInProcess; Close shuts it down, which cuts off the
// Buses connected to it.
func Embedded(opts Options) (*Bus, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv, err := server.NewServer(&server.Options{
		DontListen: true,
		NoSigs:     true,
		MaxPayload: MaxPayload,
	})
	if err != nil {
		return nil, fmt.Errorf("natsbus: embedded server: %w", err)
	}
	srv.SetLoggerV2(serverLog{log.With("component", "nats-server")}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(startWait) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("natsbus: embedded server not ready after %s", startWait)
	}
	b, err := dial("", srv, opts)
	if err != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, err
	}
	b.srv = srv
	return b, nil
}

// serverLog is nats-server's Logger on slog.
type serverLog struct{ l *slog.Logger }

func (s serverLog) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLog) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s serverLog) Fatalf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLog) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s serverLog) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s serverLog) Tracef(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
