package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run, or of several runs merged. Counts add up
// when runs are merged; rates add up (the runs ran side by side); phase
// durations take the longest.
type Report struct {
	Runs    []string  `json:"runs"` // run ids
	Started time.Time `json:"started"`
	Targets []string  `json:"targets"`

	Settings struct {
		Conns       int     `json:"conns"`
		SoakSec     float64 `json:"soak_s"`
		DurationSec float64 `json:"duration_s"`
		Rate        float64 `json:"rate"`
		DeliverRate float64 `json:"deliver_rate,omitempty"`
		Storm       float64 `json:"storm"`
		Pace        string  `json:"pace,omitempty"`
	} `json:"settings"`

	Connect struct {
		Wanted    int        `json:"wanted"`
		Held      int        `json:"held"` // connections open after the soak
		Failed    int        `json:"failed"`
		Seconds   float64    `json:"seconds"`
		Rate      float64    `json:"handshakes_per_s"`
		Handshake *Histogram `json:"handshake"` // dial to ready
	} `json:"connect"`

	Messages struct {
		Sent     int        `json:"sent"`
		Answered int        `json:"answered"`
		Lost     int        `json:"lost"`
		Seconds  float64    `json:"seconds"`
		Rate     float64    `json:"sent_per_s"`
		Latency  *Histogram `json:"latency"` // text sent (with -pace phone: due) to the final answer
		// With -pace phone: from the write of the text to its answer, and
		// how late the write started after the text was due.
		FromWrite *Histogram `json:"latency_from_write,omitempty"`
		WriteLag  *Histogram `json:"write_lag,omitempty"`
		// InFlight counts the texts by how many texts of the same phone
		// were still unanswered when each was sent.
		InFlight inFlightCounts `json:"in_flight_at_send,omitempty"`
	} `json:"messages"`

	Deliveries struct {
		Sent     int        `json:"sent"`
		Received int        `json:"received"`
		Lost     int        `json:"lost"`
		Queued   int        `json:"queued,omitempty"` // with a ttl: 202 queued, kept in the outbox of an away phone
		Rate     float64    `json:"sent_per_s"`
		Latency  *Histogram `json:"latency"` // POST /v1/deliver to the phone's message
	} `json:"deliveries"`

	Storm struct {
		Dropped   int        `json:"dropped"`
		Back      int        `json:"back"`
		Seconds   float64    `json:"seconds"` // from the drop until the last one is back
		Rate      float64    `json:"handshakes_per_s"`
		Handshake *Histogram `json:"handshake"`
		Sent      int        `json:"sent"` // one text on each connection back, all at once
		Answered  int        `json:"answered"`
		Lost      int        `json:"lost"`
		Latency   *Histogram `json:"latency"`
	} `json:"storm"`

	// Reconnects (-reconnect): connections that ended without the run
	// asking and came back on their own.
	Reconnects reconnectsReport `json:"reconnects"`

	Held int `json:"held_at_end"` // connections open just before the end

	// Errors counts what went wrong by kind: "error:<code>" (an error frame),
	// "close:<code>" (a close the run did not ask for), "lost" (a connection
	// gone without a close frame), "dial", "hello", "write", "duplicate",
	// "deliver:<status>:<code>".
	Errors map[string]int `json:"errors"`

	Server         []ServerSample `json:"server"`
	RequireMetrics bool           `json:"require_metrics"`

	OK       bool     `json:"ok"`
	Failures []string `json:"failures"`
}

// reconnectsReport is what the phones' reconnects did (-reconnect).
type reconnectsReport struct {
	Dropped   int            `json:"dropped"`
	Ends      map[string]int `json:"ends,omitempty"` // how: "lost" (no close frame), "close:<code>"
	Back      int            `json:"back"`
	NotBack   int            `json:"not_back"` // phones away at the end (gave up, or still trying)
	FirstDrop time.Time      `json:"first_drop,omitzero"`
	LastBack  time.Time      `json:"last_back,omitzero"`
	Seconds   float64        `json:"seconds"`   // from the first drop until the last one was back
	Handshake *Histogram     `json:"handshake"` // first attempt to ready
	Away      *Histogram     `json:"away"`      // drop to ready
	Resent    int            `json:"resent"`    // unanswered texts sent again (same ids)
	Again     int            `json:"again"`     // answers or deliveries that came again, or after counting as lost
}

// newReport returns an empty report with its histograms.
func newReport() *Report {
	r := &Report{Errors: map[string]int{}}
	r.Connect.Handshake = new(Histogram)
	r.Messages.Latency = new(Histogram)
	r.Messages.FromWrite = new(Histogram)
	r.Messages.WriteLag = new(Histogram)
	r.Deliveries.Latency = new(Histogram)
	r.Storm.Handshake = new(Histogram)
	r.Storm.Latency = new(Histogram)
	r.Reconnects.Handshake = new(Histogram)
	r.Reconnects.Away = new(Histogram)
	return r
}

// judge decides OK: no failed connection, every connection held, nothing
// lost, every dropped connection back, no error of any kind, and the
// server metrics when they are required.
func (r *Report) judge() {
	var f []string
	if r.Connect.Failed > 0 {
		f = append(f, fmt.Sprintf("%d connections failed", r.Connect.Failed))
	}
	if r.Connect.Held < r.Connect.Wanted {
		f = append(f, fmt.Sprintf("%d of %d connections held after the soak", r.Connect.Held, r.Connect.Wanted))
	}
	if r.Messages.Lost > 0 {
		f = append(f, fmt.Sprintf("%d messages lost", r.Messages.Lost))
	}
	if r.Deliveries.Lost > 0 {
		f = append(f, fmt.Sprintf("%d deliveries lost", r.Deliveries.Lost))
	}
	if r.Storm.Lost > 0 {
		f = append(f, fmt.Sprintf("%d texts after the storm lost", r.Storm.Lost))
	}
	if r.Storm.Back < r.Storm.Dropped {
		f = append(f, fmt.Sprintf("%d of %d dropped connections came back", r.Storm.Back, r.Storm.Dropped))
	}
	if r.Reconnects.NotBack > 0 {
		f = append(f, fmt.Sprintf("%d of the phones that dropped not back", r.Reconnects.NotBack))
	}
	if n := sumValues(r.Errors); n > 0 {
		f = append(f, fmt.Sprintf("%d errors", n))
	}
	if r.RequireMetrics {
		for _, s := range r.Server {
			if s.Error != "" {
				f = append(f, fmt.Sprintf("metrics %s (%s): %s", s.URL, s.When, s.Error))
			}
		}
	}
	r.Failures, r.OK = f, len(f) == 0
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Merge adds o, a run that ran side by side with r, into r.
func (r *Report) Merge(o *Report) {
	if r.Started.IsZero() || (!o.Started.IsZero() && o.Started.Before(r.Started)) {
		r.Started = o.Started
	}
	r.Runs = append(r.Runs, o.Runs...)
	for _, t := range o.Targets {
		if !slices.Contains(r.Targets, t) {
			r.Targets = append(r.Targets, t)
		}
	}
	s, so := &r.Settings, o.Settings
	s.Conns += so.Conns
	s.SoakSec, s.DurationSec = max(s.SoakSec, so.SoakSec), max(s.DurationSec, so.DurationSec)
	s.Rate += so.Rate
	s.DeliverRate += so.DeliverRate
	s.Storm = max(s.Storm, so.Storm)
	if s.Pace != so.Pace && so.Pace != "" {
		s.Pace = strings.Trim(s.Pace+"+"+so.Pace, "+")
	}

	c, oc := &r.Connect, o.Connect
	c.Wanted += oc.Wanted
	c.Held += oc.Held
	c.Failed += oc.Failed
	c.Seconds = max(c.Seconds, oc.Seconds)
	c.Rate += oc.Rate
	c.Handshake.Merge(oc.Handshake)

	m, om := &r.Messages, o.Messages
	m.Sent += om.Sent
	m.Answered += om.Answered
	m.Lost += om.Lost
	m.Seconds = max(m.Seconds, om.Seconds)
	m.Rate += om.Rate
	m.Latency.Merge(om.Latency)
	m.FromWrite.Merge(om.FromWrite)
	m.WriteLag.Merge(om.WriteLag)
	m.InFlight.merge(om.InFlight)

	d, od := &r.Deliveries, o.Deliveries
	d.Sent += od.Sent
	d.Received += od.Received
	d.Lost += od.Lost
	d.Queued += od.Queued
	d.Rate += od.Rate
	d.Latency.Merge(od.Latency)

	st, ost := &r.Storm, o.Storm
	st.Dropped += ost.Dropped
	st.Back += ost.Back
	st.Seconds = max(st.Seconds, ost.Seconds)
	st.Rate += ost.Rate
	st.Handshake.Merge(ost.Handshake)
	st.Sent += ost.Sent
	st.Answered += ost.Answered
	st.Lost += ost.Lost
	st.Latency.Merge(ost.Latency)

	rc, orc := &r.Reconnects, o.Reconnects
	rc.Dropped += orc.Dropped
	rc.Back += orc.Back
	rc.NotBack += orc.NotBack
	for k, v := range orc.Ends {
		if rc.Ends == nil {
			rc.Ends = map[string]int{}
		}
		rc.Ends[k] += v
	}
	if rc.FirstDrop.IsZero() || (!orc.FirstDrop.IsZero() && orc.FirstDrop.Before(rc.FirstDrop)) {
		rc.FirstDrop = orc.FirstDrop
	}
	if orc.LastBack.After(rc.LastBack) {
		rc.LastBack = orc.LastBack
	}
	rc.setSeconds()
	rc.Handshake.Merge(orc.Handshake)
	rc.Away.Merge(orc.Away)
	rc.Resent += orc.Resent
	rc.Again += orc.Again

	r.Held += o.Held
	for k, v := range o.Errors {
		r.Errors[k] += v
	}
	r.Server = append(r.Server, o.Server...)
	r.RequireMetrics = r.RequireMetrics || o.RequireMetrics
	r.judge()
}

// readReport reads a report written with -json.
func readReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := newReport()
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, h := range []**Histogram{&r.Connect.Handshake, &r.Messages.Latency, &r.Messages.FromWrite, &r.Messages.WriteLag, &r.Deliveries.Latency, &r.Storm.Handshake, &r.Storm.Latency, &r.Reconnects.Handshake, &r.Reconnects.Away} {
		if *h == nil {
			*h = new(Histogram)
		}
	}
	if r.Errors == nil {
		r.Errors = map[string]int{}
	}
	return r, nil
}

// writeJSON writes r, indented, to path.
func (r *Report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable writes the report for people.
func (r *Report) WriteTable(w io.Writer) error {
	var buf bytes.Buffer
	r.writeTable(&buf)
	for line := range strings.Lines(buf.String()) {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func (r *Report) writeTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// Every row has all seven cells: a shorter one would end the
	// alignment of the columns.
	row := func(cells ...string) {
		for len(cells) < 7 {
			cells = append(cells, "")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	s := r.Settings
	pace := ""
	if s.Pace != "" {
		pace = ", paced by " + s.Pace
	}
	fmt.Fprintf(tw, "Hermes load test, run %s: %d connections to %s; soak %gs; messages %gs at %g/s%s; storm %g%%\n",
		strings.Join(r.Runs, "+"), s.Conns, strings.Join(r.Targets, ", "), s.SoakSec, s.DurationSec, s.Rate, pace, s.Storm*100)
	row("", "count", "rate/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms")
	lat := func(h *Histogram) []string {
		sm := h.Summary()
		if sm.Count == 0 {
			return []string{"-", "-", "-", "-"}
		}
		return []string{f2(sm.P50), f2(sm.P99), f2(sm.P999), f2(sm.Max)}
	}
	c := r.Connect
	row(append([]string{"handshakes", fmt.Sprintf("%d of %d (%d failed)", c.Wanted-c.Failed, c.Wanted, c.Failed), f1(c.Rate)}, lat(c.Handshake)...)...)
	row("connections held", fmt.Sprintf("%d after the soak, %d at the end", c.Held, r.Held))
	m := r.Messages
	row(append([]string{"messages", fmt.Sprintf("%d sent, %d answered, %d lost", m.Sent, m.Answered, m.Lost), f1(m.Rate)}, lat(m.Latency)...)...)
	if m.InFlight.total() > 0 {
		row("  phone's texts unanswered at send", m.InFlight.String())
	}
	if m.FromWrite.Count() > 0 || m.WriteLag.Count() > 0 {
		row(append([]string{"  from the write", "(the above: from when due)", ""}, lat(m.FromWrite)...)...)
		row(append([]string{"  write late by", "", ""}, lat(m.WriteLag)...)...)
	}
	if d := r.Deliveries; d.Sent > 0 || s.DeliverRate > 0 {
		row(append([]string{"deliveries", fmt.Sprintf("%d sent, %d received, %d lost", d.Sent, d.Received, d.Lost), f1(d.Rate)}, lat(d.Latency)...)...)
	}
	if st := r.Storm; st.Dropped > 0 {
		row(append([]string{"reconnect storm", fmt.Sprintf("%d dropped, %d back in %.2fs", st.Dropped, st.Back, st.Seconds), f1(st.Rate)}, lat(st.Handshake)...)...)
		row(append([]string{"texts after it", fmt.Sprintf("%d sent at once, %d answered, %d lost", st.Sent, st.Answered, st.Lost), ""}, lat(st.Latency)...)...)
	}
	if rc := r.Reconnects; rc.Dropped > 0 {
		var ends []string
		for _, k := range slices.Sorted(maps.Keys(rc.Ends)) {
			ends = append(ends, fmt.Sprintf("%s %d", k, rc.Ends[k]))
		}
		row(append([]string{"reconnects", fmt.Sprintf("%d dropped (%s), %d back, %d not; all back %.2fs after the first drop",
			rc.Dropped, strings.Join(ends, ", "), rc.Back, rc.NotBack, rc.Seconds), ""}, lat(rc.Handshake)...)...)
		row(append([]string{"  away (drop to ready)", "", ""}, lat(rc.Away)...)...)
		row("  texts sent again", fmt.Sprintf("%d; outputs that came again or late: %d", rc.Resent, rc.Again))
	}
	if d := r.Deliveries; d.Queued > 0 {
		row("  deliveries queued (202)", fmt.Sprint(d.Queued))
	}
	if len(r.Errors) == 0 {
		row("errors", "none")
	}
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		row("errors", fmt.Sprintf("%s: %d", k, r.Errors[k]))
	}
	if r.OK {
		row("result", "PASS")
	} else {
		row("result", "FAIL: "+strings.Join(r.Failures, "; "))
	}
	tw.Flush()
	if len(r.Server) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "server\twhen\tRSS\tgoroutines\t/metrics")
	for _, sv := range r.Server {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sv.Name, sv.When, mib(sv.RSSBytes), num(sv.Goroutines), sv.URL)
	}
	tw.Flush()
}

// setSeconds is the time from the first drop until the last phone was
// back (0 when none came back).
func (rc *reconnectsReport) setSeconds() {
	rc.Seconds = 0
	if !rc.FirstDrop.IsZero() && rc.LastBack.After(rc.FirstDrop) {
		rc.Seconds = rc.LastBack.Sub(rc.FirstDrop).Seconds()
	}
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

func mib(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", *v/(1<<20))
}

func num(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", *v)
}

// errCounter counts errors by kind; safe for concurrent use.
type errCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errCounter) add(kind string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	e.m[kind]++
}

func (e *errCounter) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.m))
	maps.Copy(out, e.m)
	return out
}

// inFlightCounts[i] is how many texts were sent while i texts of the same
// phone were unanswered (the last counts that many or more).
type inFlightCounts []int

// inFlightMax is the last count kept apart.
const inFlightMax = 8

func (c *inFlightCounts) add(n int) {
	n = min(max(n, 0), inFlightMax)
	for len(*c) <= n {
		*c = append(*c, 0)
	}
	(*c)[n]++
}

func (c *inFlightCounts) merge(o inFlightCounts) {
	for i, v := range o {
		for len(*c) <= i {
			*c = append(*c, 0)
		}
		(*c)[i] += v
	}
}

func (c inFlightCounts) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// String is the share of each count: "0: 97.1%, 1: 2.8%, 2: 0.1%".
func (c inFlightCounts) String() string {
	t := c.total()
	var parts []string
	for i, v := range c {
		if v == 0 {
			continue
		}
		label := fmt.Sprint(i)
		if i == inFlightMax {
			label += "+"
		}
		parts = append(parts, fmt.Sprintf("%s: %.1f%%", label, 100*float64(v)/float64(t)))
	}
	return strings.Join(parts, ", ")
}
