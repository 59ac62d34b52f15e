package tenant

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// DefaultInterval is how often Run reads the tenants file again.
const DefaultInterval = time.Second

// Options configure a Registry.
type Options struct {
	// Path is the tenants file (MOBILE_TENANTS_FILE).
	Path string
	// Interval is how often Run reads the file again (DefaultInterval):
	// a change is taken within it, however it was made (written in place,
	// renamed over, a Kubernetes Secret's symlink swapped), since the
	// content is compared, not the file's events.
	Interval time.Duration
	// Log tells of reloads; nil logs nothing.
	Log *slog.Logger
	// Meter makes hermes_tenants_reloads; nil records nothing.
	Meter metric.Meter
}

// Registry holds the last good reading of the tenants file and reads it
// again on Reload: a file that does not parse leaves the last good one in
// place, is logged and counted. A nil *Registry is a deployment without a
// file: Snapshot is nil, and only the legacy owner exists.
type Registry struct {
	opts Options
	log  *slog.Logger
	cur  atomic.Pointer[Snapshot]

	mu      sync.Mutex // one reload at a time
	badSum  [sha256.Size]byte
	hasBad  bool
	subs    map[int]func(*Snapshot)
	nextSub int
	reloads metric.Int64Counter
	okOpt   metric.AddOption
	errOpt  metric.AddOption
}

// Open reads the tenants file at opts.Path. An error (the file cannot be
// read, or does not parse) names the file and the line: a process stops
// with it rather than start with no owners.
func Open(opts Options) (*Registry, error) {
	if opts.Path == "" {
		return nil, errNoFile
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	r := &Registry{opts: opts, log: opts.Log, subs: make(map[int]func(*Snapshot))}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	m := opts.Meter
	if m == nil {
		m = noop.NewMeterProvider().Meter("tenant")
	}
	var err error
	r.reloads, err = m.Int64Counter("hermes_tenants_reloads",
		metric.WithDescription("Readings of the tenants file after the first, by result: ok (a changed file taken) or error (a file that did not parse, or could not be read: the last good one stays)."))
	if err != nil {
		return nil, err
	}
	r.okOpt = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "ok")))
	r.errOpt = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "error")))
	ctx := context.Background()
	r.reloads.Add(ctx, 0, r.okOpt)
	r.reloads.Add(ctx, 0, r.errOpt)
	s, err := r.read()
	if err != nil {
		return nil, err
	}
	r.cur.Store(s)
	return r, nil
}

func (r *Registry) read() (*Snapshot, error) {
	data, err := os.ReadFile(r.opts.Path)
	if err != nil {
		return nil, fmt.Errorf("MOBILE_TENANTS_FILE: %w", err)
	}
	return Parse(r.opts.Path, data)
}

// Snapshot is the last good reading; nil for a nil Registry.
func (r *Registry) Snapshot() *Snapshot {
	if r == nil {
		return nil
	}
	return r.cur.Load()
}

// OnChange calls f with every new snapshot a reload takes, in the
// reloading goroutine, until the function it returns is called. f must
// not block for long.
func (r *Registry) OnChange(f func(*Snapshot)) (stop func()) {
	if r == nil {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextSub++
	id := r.nextSub
	r.subs[id] = f
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.subs, id)
	}
}

// Reload reads the file again and takes it when its content changed.
// A file that cannot be read or does not parse leaves the last good
// snapshot in place, is logged at error and counted once per content
// (unless force: SIGHUP asks again), and is the error returned.
func (r *Registry) Reload(force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// failed counts and logs a bad reading once per content (sum; zero
	// stands for "unreadable"), or again when forced.
	failed := func(sum [sha256.Size]byte, msg string, err error) error {
		if force || !r.hasBad || r.badSum != sum {
			r.badSum, r.hasBad = sum, true
			r.reloads.Add(context.Background(), 1, r.errOpt)
			r.log.Error(msg+": keeping the last good one", "err", err)
		}
		return err
	}
	data, err := os.ReadFile(r.opts.Path)
	if err != nil {
		return failed([sha256.Size]byte{}, "the tenants file could not be read", fmt.Errorf("MOBILE_TENANTS_FILE: %w", err))
	}
	sum := sha256.Sum256(data)
	if cur := r.cur.Load(); bytes.Equal(cur.sum[:], sum[:]) {
		r.hasBad = false // back to the good file
		return nil
	}
	s, err := Parse(r.opts.Path, data)
	if err != nil {
		return failed(sum, "the tenants file did not parse", err)
	}
	r.hasBad = false
	r.cur.Store(s)
	r.reloads.Add(context.Background(), 1, r.okOpt)
	r.log.Info("tenants file reloaded", "owners", len(s.Tenants), "keys", len(s.keys))
	for _, f := range r.subs {
		f(s)
	}
	return nil
}

// Run reloads every Interval and at each value of hup (SIGHUP, which the
// caller subscribes with signal.Notify), until ctx ends.
func (r *Registry) Run(ctx context.Context, hup <-chan os.Signal) {
	if r == nil {
		return
	}
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = r.Reload(false) // logged and counted
		case <-hup:
			r.log.Info("SIGHUP: reading the tenants file again")
			_ = r.Reload(true) // logged and counted
		}
	}
}
