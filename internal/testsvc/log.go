package testsvc

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// LogWriter is an io.Writer to t.Log, one call per Write (a trailing
// newline dropped), until t's cleanups run: what is written after that (by
// goroutines a test leaves behind, such as a closed connection's clean-up
// or a client library's callback) is dropped, since t.Log then races with
// the test's end. Call it before starting what logs to it, so its cleanup
// runs after theirs.
func LogWriter(t testing.TB) io.Writer {
	w := &logWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return w
}

type logWriter struct {
	t     testing.TB
	mu    sync.Mutex
	ended bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// Logger is a text slog.Logger at debug level writing to LogWriter(t), so a
// failing test shows what the code under test logged.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug}))
}
