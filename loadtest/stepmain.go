package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// Bounds of step mode.
const (
	// MaxStep bounds the time of one step.
	MaxStep = 10 * time.Minute
	// MaxStepRate bounds a rate offered in step mode: above the message
	// phase's MaxRate, so that the floor can be driven to its saturation.
	MaxStepRate = 100000
	// MaxInFlight bounds the HTTP requests or handshakes in flight at once.
	MaxInFlight = 5000
	// MaxBatch bounds the deliveries of one batch request: the router's
	// default MaxBatchItems.
	MaxBatch = 1000
	// defaultRates are the steps offered unless -rates says otherwise.
	defaultRates = "100,200,500,1000,2000,5000,10000,20000,50000"
)

// stepConfig is one run of step mode.
type stepConfig struct {
	Scenarios    []string
	URLs         []string
	Token        string
	Phones       int
	Rates        []float64
	Step         time.Duration
	Rule         stepRule
	Floor        string // "auto" (in this process), "off", or a floor's URL
	DeliverURL   string
	DeliverToken string
	Batch        int // deliveries per request of deliver-batch
	InFlight     int
	Sources      int
	RunID        string
	JSONPath     string
}

func (c stepConfig) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(c.Scenarios) == 0 {
		bad("-scenario: one or more of %s, or all", strings.Join(scenarios, ", "))
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(scenarios, s) {
			bad("-scenario: %q is not one of %s, all", s, strings.Join(scenarios, ", "))
		}
		if (s == "deliver" || s == "deliver-batch") && (c.DeliverURL == "" || c.DeliverToken == "") {
			bad("-scenario %s needs -deliver and -deliver-token", s)
		}
	}
	if len(c.URLs) == 0 {
		bad("-url: at least one WebSocket URL")
	}
	for _, u := range c.URLs {
		if err := checkLoopback(u, "ws"); err != nil {
			bad("-url: %w", err)
		}
	}
	if c.DeliverURL != "" {
		if err := checkLoopback(c.DeliverURL, "http"); err != nil {
			bad("-deliver: %w", err)
		}
	}
	switch c.Floor {
	case "auto", "off":
	default:
		if err := checkLoopback(c.Floor, "ws"); err != nil {
			bad("-floor: auto, off or the floor's URL: %w", err)
		}
	}
	if c.Token == "" {
		bad("-token (or MOBILE_TOKEN) is required")
	}
	if c.Phones < 1 || c.Phones > MaxConns {
		bad("-phones: %d is not in [1, %d]", c.Phones, MaxConns)
	}
	if len(c.Rates) == 0 {
		bad("-rates: at least one rate")
	}
	for i, r := range c.Rates {
		if !(r > 0 && r <= MaxStepRate) {
			bad("-rates: %g is not in (0, %d]", r, MaxStepRate)
		}
		if i > 0 && r <= c.Rates[i-1] {
			bad("-rates: %g after %g: the rates must increase", r, c.Rates[i-1])
		}
	}
	if c.Step <= 0 || c.Step > MaxStep {
		bad("-step: %s is not in (0, %s]", c.Step, MaxStep)
	}
	if c.Rule.MissAfter <= 0 || c.Rule.MissAfter > MaxAnswerWait {
		bad("-miss-after: %s is not in (0, %s]", c.Rule.MissAfter, MaxAnswerWait)
	}
	if c.Rule.P99Max <= 0 || c.Rule.P99Max > c.Rule.MissAfter {
		bad("-p99-max: %s is not in (0, -miss-after]", c.Rule.P99Max)
	}
	if !(c.Rule.MinAchieved > 0 && c.Rule.MinAchieved <= 1) {
		bad("-min-achieved: %g is not in (0, 1]", c.Rule.MinAchieved)
	}
	if c.Batch < 1 || c.Batch > MaxBatch {
		bad("-batch: %d is not in [1, %d]", c.Batch, MaxBatch)
	}
	if c.InFlight < 1 || c.InFlight > MaxInFlight {
		bad("-in-flight: %d is not in [1, %d]", c.InFlight, MaxInFlight)
	}
	if c.Sources < 1 || c.Sources > sourceCount {
		bad("-sources: %d is not in [1, %d]", c.Sources, sourceCount)
	}
	if strings.ContainsAny(c.RunID, " \t\n") || len(c.RunID) > 32 {
		bad("-run: %q must be a word of at most 32 characters", c.RunID)
	}
	return errors.Join(errs...)
}

// parseRates reads "100,200,1k,2.5k".
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, v := range config.List(s) {
		mult := 1.0
		if rest, ok := strings.CutSuffix(strings.ToLower(v), "k"); ok {
			v, mult = rest, 1000
		}
		r, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("-rates: %q is not a number", v)
		}
		out = append(out, r*mult)
	}
	return out, nil
}

// StepReport is what step mode reports: per scenario, the sweep of the
// gateway and of the floor.
type StepReport struct {
	Runs      []string          `json:"runs"`
	Started   time.Time         `json:"started"`
	Settings  stepSettings      `json:"settings"`
	Scenarios []*ScenarioReport `json:"scenarios"`
}

type stepSettings struct {
	URLs        []string  `json:"urls"`
	Floor       string    `json:"floor"`
	Phones      int       `json:"phones"`
	Rates       []float64 `json:"rates"`
	StepSec     float64   `json:"step_s"`
	MissAfterMs float64   `json:"miss_after_ms"`
	P99MaxMs    float64   `json:"p99_max_ms"`
	MinAchieved float64   `json:"min_achieved"`
	InFlight    int       `json:"in_flight"`
}

// ScenarioReport is one scenario's sweeps.
type ScenarioReport struct {
	Name    string `json:"name"`
	What    string `json:"what"`
	Floor   string `json:"floor_what"`
	Gateway *Sweep `json:"gateway"`
	FloorW  *Sweep `json:"floor,omitempty"`
	Ratio   *Ratio `json:"ratio,omitempty"`
}

// stepMain runs `loadtest step`.
func stepMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest step", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                                         stepConfig
		scen, urls, rates, runID, deliverURL, jsonP string
		token, deliverToken                         secret.Secret
	)
	fs.StringVar(&scen, "scenario", "roundtrip", "what to offer: "+strings.Join(scenarios, ", ")+", comma-separated, or all")
	fs.StringVar(&urls, "url", "ws://127.0.0.1:8787/ws", "WebSocket URLs of the edges, comma-separated; phones are split over them (loopback only)")
	config.Secret(fs, &token, "token", "MOBILE_TOKEN", "the app token (the floor's too)")
	fs.IntVar(&cfg.Phones, "phones", 200, "phones held by the roundtrip, deliver and cron scenarios, on the gateway and on the floor")
	fs.StringVar(&rates, "rates", defaultRates, "the rates offered, operations per second, increasing, comma-separated (1k = 1000)")
	fs.DurationVar(&cfg.Step, "step", 10*time.Second, "how long each rate is offered")
	fs.DurationVar(&cfg.Rule.MissAfter, "miss-after", 5*time.Second, "an operation not answered this long after it started is missed")
	fs.DurationVar(&cfg.Rule.P99Max, "p99-max", 250*time.Millisecond, "a step whose p99 is above this is saturated")
	fs.Float64Var(&cfg.Rule.MinAchieved, "min-achieved", 0.9, "a step achieving less than this fraction of its offered rate is saturated")
	fs.StringVar(&cfg.Floor, "floor", "auto", "the floor: auto (started in this process), off, or the ws:// URL of `loadtest floor`")
	fs.StringVar(&deliverURL, "deliver", "", "router API base URL, for the deliver scenario (loopback only)")
	config.Secret(fs, &deliverToken, "deliver-token", "LOADTEST_DELIVER_TOKEN", "a deliver token of the router (MOBILE_DELIVER_TOKENS)")
	fs.IntVar(&cfg.Batch, "batch", 100, "deliveries per POST /v1/deliver/batch in the deliver-batch scenario")
	fs.IntVar(&cfg.InFlight, "in-flight", 1000, "HTTP requests (deliver) or handshakes (hello) in flight at most; one beyond counts as failed (client_busy)")
	fs.IntVar(&cfg.Sources, "sources", sourceCount, "how many source addresses, from 127.0.0.2 on, connections are spread over (1-253)")
	fs.StringVar(&runID, "run", "", "run id, part of every device id; random when empty")
	fs.StringVar(&jsonP, "json", "", "also write the report as JSON to this file")
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadtest step:", err)
		return exitUsage
	}
	cfg.Scenarios = config.List(scen)
	if slices.Equal(cfg.Scenarios, []string{"all"}) {
		cfg.Scenarios = scenarios
	}
	cfg.URLs, cfg.Token, cfg.RunID, cfg.JSONPath = config.List(urls), string(token), runID, jsonP
	cfg.DeliverURL, cfg.DeliverToken = strings.TrimRight(deliverURL, "/"), string(deliverToken)
	if cfg.RunID == "" {
		cfg.RunID = randomHex(3)
	}
	var err error
	if cfg.Rates, err = parseRates(rates); err == nil {
		err = cfg.validate()
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadtest step:", err)
		return exitUsage
	}
	if err := checkFiles(cfg.Phones*2 + cfg.InFlight); err != nil {
		fmt.Fprintln(stderr, "loadtest step:", err)
		return exitUsage
	}
	rep, ok := runSteps(ctx, cfg, stderr)
	_ = rep.WriteTable(stdout) // stdout: nothing to do about a failed write
	if cfg.JSONPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.JSONPath, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(stderr, "loadtest step:", err)
			return exitUsage
		}
	}
	if !ok {
		return exitFailed
	}
	return 0
}

// runSteps runs every scenario of cfg: the floor's sweep, then the
// gateway's. ok is false when a sweep could not run (its phones did not
// connect) or completed nothing at all.
func runSteps(ctx context.Context, cfg stepConfig, progress io.Writer) (*StepReport, bool) {
	logf := func(format string, a ...any) {
		fmt.Fprintf(progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	rep := &StepReport{Runs: []string{cfg.RunID}, Started: time.Now(), Settings: stepSettings{
		URLs: cfg.URLs, Floor: cfg.Floor, Phones: cfg.Phones, Rates: cfg.Rates, StepSec: cfg.Step.Seconds(),
		MissAfterMs: ms(cfg.Rule.MissAfter), P99MaxMs: ms(cfg.Rule.P99Max), MinAchieved: cfg.Rule.MinAchieved, InFlight: cfg.InFlight,
	}}
	floorURL := cfg.Floor
	if cfg.Floor == "auto" {
		f, err := startFloor("127.0.0.1:0", cfg.Token)
		if err != nil {
			logf("%v", err)
			return rep, false
		}
		defer f.Close()
		floorURL = f.URL()
		logf("floor in this process at %s", floorURL)
	}
	ok := true
	for _, name := range cfg.Scenarios {
		sr := &ScenarioReport{Name: name, What: scenarioWhat[name][0], Floor: scenarioWhat[name][1]}
		rep.Scenarios = append(rep.Scenarios, sr)
		if floorURL != "off" {
			sr.FloorW = runSweep(ctx, cfg, name, true, []string{floorURL}, logf)
			ok = ok && sweepOK(sr.FloorW)
		}
		sr.Gateway = runSweep(ctx, cfg, name, false, cfg.URLs, logf)
		ok = ok && sweepOK(sr.Gateway)
		if sr.FloorW != nil {
			r := ratio(sr.Gateway, sr.FloorW)
			sr.Ratio = &r
		}
	}
	return rep, ok
}

func sweepOK(w *Sweep) bool { return w.Failed == "" && len(w.Steps) > 0 && w.Steps[0].Done > 0 }

// runSweep connects one side of a scenario and sweeps the rates.
func runSweep(ctx context.Context, cfg stepConfig, name string, floor bool, urls []string, logf func(string, ...any)) *Sweep {
	w := &Sweep{Target: "gateway", URLs: urls}
	if floor {
		w.Target = "floor"
	}
	tr := newTracker(cfg.Rule)
	logf("%s on the %s (%s): connecting", name, w.Target, strings.Join(urls, ", "))
	tg, err := prepare(ctx, cfg, name, floor, urls, tr)
	if err != nil {
		w.Failed = err.Error()
		logf("%s on the %s: %v", name, w.Target, err)
		return w
	}
	tr.sweep(ctx, w, cfg.Rates, cfg.Step, tg.offer, func(s StepResult) {
		logf("%s on the %s: %g/s offered → %.0f/s achieved, p50 %s, p99 %s, %d missed, %d failed, load %.2f%s",
			name, w.Target, s.Offered, s.Achieved, msCell(s.P50), msCell(s.P99), s.Missed, s.Failed, s.Load1, satNote(s))
	})
	tg.close()
	return w
}

func satNote(s StepResult) string {
	if s.Saturated {
		return ": saturated (" + s.Why + ")"
	}
	return ""
}

// msCell shows a latency in ms, or "miss" when it is over -miss-after.
func msCell(v float64) string {
	if v < 0 {
		return "miss"
	}
	return fmt.Sprintf("%.1f", v)
}

// WriteTable writes the report for people: per scenario the steps of the
// gateway and of the floor, and the ratios.
func (r *StepReport) WriteTable(w io.Writer) error {
	var buf bytes.Buffer
	r.writeTable(&buf)
	for line := range strings.Lines(buf.String()) {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

func (r *StepReport) writeTable(w io.Writer) {
	s := r.Settings
	fmt.Fprintf(w, "Hermes step run %s: %gs a step, saturated below %.0f%% of the offered rate or p99 over %g ms; missed after %g ms\n",
		strings.Join(r.Runs, "+"), s.StepSec, s.MinAchieved*100, s.P99MaxMs, s.MissAfterMs)
	for _, sc := range r.Scenarios {
		fmt.Fprintf(w, "\n%s: %s (floor: %s)\n", sc.Name, sc.What, sc.Floor)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\toffered/s\tsent/s\tachieved/s\t÷ floor\tp50 ms\tp99 ms\tmissed\tfailed\tload1\t\t")
		for _, sw := range []*Sweep{sc.Gateway, sc.FloorW} {
			if sw == nil {
				continue
			}
			if sw.Failed != "" {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\tcould not run: %s\n", sw.Target, sw.Failed)
				continue
			}
			for _, st := range sw.Steps {
				vs := "-"
				if sw == sc.Gateway && sc.FloorW != nil {
					if fst := sc.FloorW.step(st.Offered); fst != nil && fst.Achieved > 0 {
						vs = fmt.Sprintf("%.2f", st.Achieved/fst.Achieved)
					}
				}
				verdict := "ok"
				if st.Saturated {
					verdict = "saturated: " + st.Why
				}
				fmt.Fprintf(tw, "%s\t%g\t%.0f\t%.0f\t%s\t%s\t%s\t%d\t%d\t%.2f\t\t%s\n", sw.Target, st.Offered, st.SentRate, st.Achieved, vs,
					msCell(st.P50), msCell(st.P99), st.Missed, st.Failed, st.Load1, verdict)
			}
		}
		tw.Flush()
		for _, sw := range []*Sweep{sc.Gateway, sc.FloorW} {
			if sw == nil || sw.Failed != "" {
				continue
			}
			for _, st := range sw.Steps {
				if len(st.Errors) > 0 {
					fmt.Fprintf(w, "  %s at %g/s: errors %s\n", sw.Target, st.Offered, errorList(st.Errors))
				}
			}
		}
		fmt.Fprintf(w, "  sustained: gateway %s, floor %s", sustainedText(sc.Gateway), sustainedText(sc.FloorW))
		if sc.Ratio != nil {
			fmt.Fprintf(w, "; ratio to the floor: sustained %s, peak achieved %.2f", ratioText(*sc.Ratio), sc.Ratio.Peak)
		}
		fmt.Fprintln(w)
	}
}

func sustainedText(w *Sweep) string {
	switch {
	case w == nil:
		return "not measured"
	case w.Failed != "":
		return "could not run"
	case w.Sustained == 0:
		return fmt.Sprintf("below %g/s (peak %.0f/s)", w.Steps[0].Offered, w.Peak)
	case !w.Saturated:
		return fmt.Sprintf("≥ %g/s (not saturated; peak %.0f/s)", w.Sustained, w.Peak)
	}
	return fmt.Sprintf("%g/s (peak %.0f/s)", w.Sustained, w.Peak)
}

func ratioText(r Ratio) string {
	switch r.Bound {
	case "=":
		return fmt.Sprintf("%.2f", r.Sustained)
	case "<=":
		return fmt.Sprintf("≤ %.2f", r.Sustained)
	case ">=":
		return fmt.Sprintf("≥ %.2f", r.Sustained)
	}
	return "unknown"
}

func errorList(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d", k, m[k])
	}
	return b.String()
}
