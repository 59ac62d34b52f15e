package usage_test

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/tenant"
	"github.com/hermes-mobile/gateway/pkg/usage"
)

// tenantsFile is a file of the owners ids, each with one app key.
func tenantsFile(ids ...string) string {
	s := "tenants:\n"
	for _, id := range ids {
		s += "  - id: " + id + "\n    keys:\n      - {id: app, kind: app, secret: " + id + "-app}\n"
	}
	if len(ids) == 0 {
		s += "  []\n"
	}
	return s
}

// registry opens a tenants file of ids; write changes it (Reload takes it).
func registry(t *testing.T, ids ...string) (*tenant.Registry, func(ids ...string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(ids ...string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tenantsFile(ids...)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(ids...)
	reg, err := tenant.Open(tenant.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	return reg, func(ids ...string) {
		t.Helper()
		write(ids...)
		if err := reg.Reload(false); err != nil {
			t.Fatal(err)
		}
	}
}

// series reads the hermes_owner_* series through the SDK's reader: by
// metric name, then "<owner>" or "<owner>/<result or quota>".
func series(t *testing.T, rd *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			got := map[string]int64{}
			for _, dp := range sum.DataPoints {
				owner, _ := dp.Attributes.Value("owner")
				k := owner.AsString()
				for _, extra := range []string{"result", "quota"} {
					if v, ok := dp.Attributes.Value(attribute.Key(extra)); ok {
						k += "/" + v.AsString()
					}
				}
				got[k] = dp.Value
			}
			out[m.Name] = got
		}
	}
	return out
}

func newRecorder(t *testing.T, reg *tenant.Registry, st store.Usage) (*usage.Recorder, *sdkmetric.ManualReader) {
	t.Helper()
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	r, err := usage.New(usage.Options{Tenants: reg, Store: st, Meter: mp.Meter("usage"), Edge: true})
	if err != nil {
		t.Fatal(err)
	}
	return r, rd
}

func wantSeries(t *testing.T, got map[string]map[string]int64, name string, want map[string]int64) {
	t.Helper()
	if !maps.Equal(got[name], want) {
		t.Errorf("%s = %v, want %v", name, got[name], want)
	}
}

// TestSeriesByOwner: every owner of the file and the legacy owner
// (_legacy) have their series from the start at 0; each counts its own;
// a reload drops a removed owner's series, starts a new owner's at 0 and
// keeps a kept owner's counts.
func TestSeriesByOwner(t *testing.T) {
	reg, rewrite := registry(t, "acme", "beta")
	r, rd := newRecorder(t, reg, nil)

	got := series(t, rd)
	zero := map[string]int64{"_legacy": 0, "acme": 0, "beta": 0}
	for _, name := range []string{"hermes_owner_connections", "hermes_owner_connections_opened", "hermes_owner_messages_in", "hermes_owner_messages_out"} {
		wantSeries(t, got, name, zero)
	}
	wantSeries(t, got, "hermes_owner_deliveries", map[string]int64{
		"_legacy/accepted": 0, "_legacy/offline": 0, "acme/accepted": 0, "acme/offline": 0, "beta/accepted": 0, "beta/offline": 0})
	if n := len(got["hermes_owner_quota_refusals"]); n != 9 {
		t.Errorf("hermes_owner_quota_refusals has %d series, want 3 owners × 3 quotas: %v", n, got["hermes_owner_quota_refusals"])
	}

	acme := r.Owner("acme")
	acme.Opened()
	acme.Opened()
	acme.Closed()
	r.Add("acme", usage.MessagesIn, 3)
	r.Add(tenant.Legacy, usage.MessagesIn, 1)
	r.Add("beta", usage.MessagesOut, 5)
	r.Delivery("acme", true)
	r.Delivery("acme", false)
	r.Delivery("acme", false)
	r.Delivery(tenant.Legacy, true)
	r.Refused("beta", tenant.QuotaConnections, 1)
	r.Refused("beta", "no-such-quota", 1)
	r.Add("nobody", usage.MessagesIn, 100) // not an owner: nothing
	got = series(t, rd)
	wantSeries(t, got, "hermes_owner_connections", map[string]int64{"_legacy": 0, "acme": 1, "beta": 0})
	wantSeries(t, got, "hermes_owner_connections_opened", map[string]int64{"_legacy": 0, "acme": 2, "beta": 0})
	wantSeries(t, got, "hermes_owner_messages_in", map[string]int64{"_legacy": 1, "acme": 3, "beta": 0})
	wantSeries(t, got, "hermes_owner_messages_out", map[string]int64{"_legacy": 0, "acme": 0, "beta": 5})
	wantSeries(t, got, "hermes_owner_deliveries", map[string]int64{
		"_legacy/accepted": 1, "_legacy/offline": 0, "acme/accepted": 1, "acme/offline": 2, "beta/accepted": 0, "beta/offline": 0})
	if got := got["hermes_owner_quota_refusals"]; got["beta/connections"] != 1 || got["beta/event_reads"] != 0 || got["acme/connections"] != 0 {
		t.Errorf("hermes_owner_quota_refusals = %v, want beta/connections 1 and the rest 0", got)
	}

	rewrite("acme", "gamma")
	if r.Owner("beta") != nil {
		t.Error("a removed owner is still counted")
	}
	r.Add("beta", usage.MessagesOut, 1) // counts nothing now
	got = series(t, rd)
	wantSeries(t, got, "hermes_owner_messages_in", map[string]int64{"_legacy": 1, "acme": 3, "gamma": 0})
	wantSeries(t, got, "hermes_owner_messages_out", map[string]int64{"_legacy": 0, "acme": 0, "gamma": 0})
	wantSeries(t, got, "hermes_owner_connections", map[string]int64{"_legacy": 0, "acme": 1, "gamma": 0})
	acme.Closed() // the socket counted before the reload: the same owner
	if got := series(t, rd)["hermes_owner_connections"]["acme"]; got != 0 {
		t.Errorf("acme's open sockets = %d after both closed, want 0", got)
	}
}

// TestWithoutFile: with no tenants file the legacy owner is the one
// counted.
func TestWithoutFile(t *testing.T) {
	r, rd := newRecorder(t, nil, nil)
	r.Add(tenant.Legacy, usage.MessagesIn, 2)
	wantSeries(t, series(t, rd), "hermes_owner_messages_in", map[string]int64{"_legacy": 2})
	var none *usage.Recorder // a process without one counts nothing, and does not fail
	none.Add(tenant.Legacy, usage.MessagesIn, 1)
	none.Owner("acme").Opened()
	if err := none.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestCountingAllocatesNothing: the counting on the hot paths (a frame, a
// delivery, a hello) allocates nothing.
func TestCountingAllocatesNothing(t *testing.T) {
	reg, _ := registry(t, "acme")
	r, _ := newRecorder(t, reg, nil)
	o := r.Owner("acme")
	if n := testing.AllocsPerRun(100, func() {
		r.Add("acme", usage.MessagesIn, 1)
		r.Delivery("acme", true)
		r.Refused("acme", tenant.QuotaEventReads, 1)
		o.Add(usage.MessagesOut, 1)
		o.Opened()
		o.Closed()
	}); n != 0 {
		t.Errorf("counting allocates %v times", n)
	}
}

func wantUsage(t *testing.T, st store.Usage, owner string, want store.UsageCounts) {
	t.Helper()
	got, _, err := st.Usage(t.Context(), owner)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("the store's usage of %q = %v, want %v", owner, got, want)
	}
}

// TestFlush: Flush adds what each owner counted since the last one to the
// store under its own owner; a failed flush keeps the counts for the
// next; an owner a reload removed has its last counts flushed; two
// recorders (two nodes) on one store add up.
func TestFlush(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	reg, rewrite := registry(t, "acme", "beta")
	r, _ := newRecorder(t, reg, st)
	other, _ := newRecorder(t, reg, st) // another node

	r.Add("acme", usage.MessagesIn, 2)
	r.Owner("acme").Opened()
	r.Delivery(tenant.Legacy, false)
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantUsage(t, st, "acme", store.UsageCounts{"messages_in": 2, "connections_opened": 1})
	wantUsage(t, st, tenant.Legacy, store.UsageCounts{"deliveries_offline": 1})
	wantUsage(t, st, "beta", store.UsageCounts{})

	// Only what is new is added; a failed flush keeps it.
	r.Add("acme", usage.MessagesIn, 1)
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.Flush(canceled); err == nil {
		t.Fatal("a flush with a canceled context succeeded")
	}
	r.Add("acme", usage.MessagesIn, 1)
	other.Add("acme", usage.MessagesIn, 10)
	other.Refused("beta", tenant.QuotaOutbox, 1)
	for _, x := range []*usage.Recorder{r, other} {
		if err := x.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wantUsage(t, st, "acme", store.UsageCounts{"messages_in": 14, "connections_opened": 1})
	wantUsage(t, st, "beta", store.UsageCounts{"refused_outbox_mib": 1})

	// A removed owner: its last counts are flushed, then nothing more.
	r.Add("beta", usage.MessagesOut, 3)
	rewrite("acme")
	r.Add("beta", usage.MessagesOut, 100) // no longer counted
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantUsage(t, st, "beta", store.UsageCounts{"refused_outbox_mib": 1, "messages_out": 3})
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantUsage(t, st, "beta", store.UsageCounts{"refused_outbox_mib": 1, "messages_out": 3})
}

// TestConcurrent counts from many goroutines while flushes and reloads
// run: the store ends with every count (run with -race).
func TestConcurrent(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	reg, rewrite := registry(t, "acme", "beta")
	r, rd := newRecorder(t, reg, st)
	const workers, each = 4, 500
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				r.Add("acme", usage.MessagesIn, 1)
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			if i%2 == 0 {
				rewrite("acme")
			} else {
				rewrite("acme", "beta")
			}
			_ = r.Flush(t.Context())
			series(t, rd)
		}
	})
	wg.Wait()
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantUsage(t, st, "acme", store.UsageCounts{"messages_in": workers * each})
}

// TestRunFlushes: Run adds the counts within its interval, with no call of
// Flush.
func TestRunFlushes(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { st.Close() })
	r, err := usage.New(usage.Options{Store: st, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r.Add(tenant.Legacy, usage.MessagesOut, 7)
	var got store.UsageCounts
	if !testsvc.Eventually(5*time.Second, func() bool {
		var err error
		if got, _, err = st.Usage(t.Context(), tenant.Legacy); err != nil {
			t.Fatal(err)
		}
		return got["messages_out"] == 7
	}) {
		t.Fatalf("the store has %v 5 s after the count, want messages_out 7", got)
	}
}

// BenchmarkCount is what an event costs its path: an owner's counter, as
// the edge and the router API count them, from every core at once.
func BenchmarkCount(b *testing.B) {
	path := filepath.Join(b.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(tenantsFile("acme", "beta")), 0o600); err != nil {
		b.Fatal(err)
	}
	reg, err := tenant.Open(tenant.Options{Path: path})
	if err != nil {
		b.Fatal(err)
	}
	r, err := usage.New(usage.Options{Tenants: reg})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Add("acme", usage.MessagesIn, 1)
		}
	})
}

// TestRouterSeries: a process without an edge serves only the series of
// both sides (deliveries, refusals), not the edge's.
func TestRouterSeries(t *testing.T) {
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	r, err := usage.New(usage.Options{Meter: mp.Meter("usage")})
	if err != nil {
		t.Fatal(err)
	}
	r.Delivery(tenant.Legacy, true)
	got := series(t, rd)
	var names []string
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"hermes_owner_deliveries", "hermes_owner_quota_refusals"}) {
		t.Errorf("a router serves %v, want the deliveries and the refusals only", names)
	}
	wantSeries(t, got, "hermes_owner_deliveries", map[string]int64{"_legacy/accepted": 1, "_legacy/offline": 0})
}
