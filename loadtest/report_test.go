package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// promText is a /metrics page as the Prometheus Go client writes it.
const promText = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 1234
# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
go_gc_duration_seconds{quantile="0.5"} 4.1e-05
# HELP hermes_connections Open connections.
hermes_connections{edge="a b"} 2000
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 5.2428800e+07
`

func TestParseMetrics(t *testing.T) {
	vals, err := parseMetrics(strings.NewReader(promText), metricRSS, metricGoroutines, "hermes_connections", "absent")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{metricRSS: 52428800, metricGoroutines: 1234, "hermes_connections": 2000} {
		if v := vals[name]; v == nil || *v != want {
			t.Errorf("%s = %v, want %g", name, v, want)
		}
	}
	if vals["absent"] != nil {
		t.Errorf("a metric that is not on the page has the value %g", *vals["absent"])
	}
	if _, err := parseMetrics(strings.NewReader("go_goroutines many\n"), metricGoroutines); err == nil {
		t.Error("a value that is not a number was accepted")
	}
}

func TestScrapeOverHTTPAndNA(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, promText)
	}))
	defer srv.Close()

	ok := scrape(context.Background(), "edge1="+srv.URL+"/metrics", "idle")
	if ok.Name != "edge1" || ok.URL != srv.URL+"/metrics" {
		t.Errorf("name=url: name %q, url %q", ok.Name, ok.URL)
	}
	if ok.Error != "" || ok.RSSBytes == nil || *ok.RSSBytes != 52428800 || ok.Goroutines == nil || *ok.Goroutines != 1234 {
		t.Errorf("scrape = %+v, want rss 52428800 and 1234 goroutines", ok)
	}
	missing := scrape(context.Background(), srv.URL+"/nothing", "end")
	if missing.Error == "" || missing.RSSBytes != nil {
		t.Errorf("scrape of a 404 = %+v, want an error and no values", missing)
	}
	srv.Close()
	gone := scrape(context.Background(), srv.URL+"/metrics", "end")
	if gone.Error == "" || gone.RSSBytes != nil || gone.Goroutines != nil {
		t.Errorf("scrape of a closed server = %+v, want an error and no values", gone)
	}

	rep := newReport()
	rep.Server = []ServerSample{ok, gone}
	rep.judge()
	if !rep.OK {
		t.Errorf("unreadable metrics failed a run that does not require them: %v", rep.Failures)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	if !hasRow(b.String(), "edge1", "idle", "50.0", "MiB", "1234") {
		t.Errorf("table lacks the server's figures:\n%s", b.String())
	}
	if !hasRow(b.String(), strings.TrimPrefix(srv.URL, "http://"), "end", "n/a", "n/a") {
		t.Errorf("table lacks n/a for the unreadable server:\n%s", b.String())
	}
	rep.RequireMetrics = true
	rep.judge()
	if rep.OK {
		t.Error("unreadable metrics passed a run that requires them")
	}
}

// hasRow reports whether a line of table starts with these fields.
func hasRow(table string, fields ...string) bool {
	for line := range strings.Lines(table) {
		f := strings.Fields(line)
		if len(f) >= len(fields) && slices.Equal(f[:len(fields)], fields) {
			return true
		}
	}
	return false
}

// sampleReport is a report with one of everything.
func sampleReport(run string, conns int, lat time.Duration) *Report {
	r := newReport()
	r.Runs, r.Targets = []string{run}, []string{"ws://127.0.0.1:8787/ws"}
	r.Started = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r.Settings.Conns, r.Settings.Rate = conns, 100
	r.Connect.Wanted, r.Connect.Held, r.Connect.Rate, r.Connect.Seconds = conns, conns, 500, 2
	r.Held = conns
	for range 100 {
		r.Connect.Handshake.Record(lat)
		r.Messages.Latency.Record(lat)
	}
	r.Messages.Sent, r.Messages.Answered, r.Messages.Rate = 100, 100, 100
	r.Storm.Dropped, r.Storm.Back = conns/4, conns/4
	r.judge()
	return r
}

func TestJudgeFailsOnEachKindOfTrouble(t *testing.T) {
	for name, spoil := range map[string]func(*Report){
		"failed connection":  func(r *Report) { r.Connect.Failed = 1 },
		"connection dropped": func(r *Report) { r.Connect.Held-- },
		"lost message":       func(r *Report) { r.Messages.Lost = 1 },
		"lost delivery":      func(r *Report) { r.Deliveries.Lost = 1 },
		"storm short":        func(r *Report) { r.Storm.Back-- },
		"lost after storm":   func(r *Report) { r.Storm.Lost = 1 },
		"error frame":        func(r *Report) { r.Errors["error:internal_error"] = 1 },
		"unexpected close":   func(r *Report) { r.Errors["close:1001"] = 1 },
	} {
		r := sampleReport("a", 8, time.Millisecond)
		if !r.OK {
			t.Fatalf("the clean sample fails: %v", r.Failures)
		}
		spoil(r)
		r.judge()
		if r.OK || len(r.Failures) != 1 {
			t.Errorf("%s: OK %v, failures %q; want one failure", name, r.OK, r.Failures)
		}
	}
}

func TestMergeOfTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	a, b := sampleReport("a", 9000, time.Millisecond), sampleReport("b", 3000, 3*time.Millisecond)
	b.Errors["close:1001"] = 2
	pa, pb := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	if err := a.writeJSON(pa); err != nil {
		t.Fatal(err)
	}
	if err := b.writeJSON(pb); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	merged := filepath.Join(dir, "all.json")
	code := realMain(context.Background(), []string{"merge", "-json", merged, pa, pb}, &out, &errOut)
	if code != exitFailed {
		t.Errorf("merge exit status %d, want %d: one run had errors; stderr %s", code, exitFailed, errOut.String())
	}
	m, err := readReport(merged)
	if err != nil {
		t.Fatal(err)
	}
	if m.Connect.Wanted != 12000 || m.Connect.Held != 12000 || m.Connect.Rate != 1000 || m.Messages.Sent != 200 {
		t.Errorf("merged counts: wanted %d held %d rate %g sent %d; want 12000, 12000, 1000, 200",
			m.Connect.Wanted, m.Connect.Held, m.Connect.Rate, m.Messages.Sent)
	}
	if s := m.Messages.Latency.Summary(); s.Count != 200 || !within(time.Duration(s.P50*1e6), time.Millisecond) ||
		!within(time.Duration(s.P99*1e6), 3*time.Millisecond) {
		t.Errorf("merged latency %+v, want 200 samples, p50 1ms, p99 3ms", s)
	}
	if m.Errors["close:1001"] != 2 || m.OK {
		t.Errorf("merged errors %v, OK %v; want close:1001 = 2 and a failure", m.Errors, m.OK)
	}
	if !strings.Contains(out.String(), "a+b") || !strings.Contains(out.String(), "close:1001: 2") {
		t.Errorf("merged table:\n%s", out.String())
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	r := sampleReport("x1", 10, 2*time.Millisecond)
	r.WriteTable(&b)
	for _, want := range []string{"run x1", "handshakes", "10 of 10 (0 failed)", "100 sent, 100 answered, 0 lost",
		"2.00", "reconnect storm", "errors", "none", "PASS"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
