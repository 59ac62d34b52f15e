package redisstore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// SetLogger sends go-redis's own log lines (dial failures and the like),
// which it otherwise prints to stderr, to l. It is process-wide, like
// go-redis's logger.
func SetLogger(l *slog.Logger) { redis.SetLogger(slogPrinter{l}) }

type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Printf(ctx context.Context, format string, v ...any) {
	p.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
