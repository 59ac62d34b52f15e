package main

// Step mode end to end: the floor subcommand, the floor's and a gateway's
// sweeps over real sockets, the exit statuses.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestFloorSubcommand runs `loadtest floor` and uses the URL it logs.
func TestFloorSubcommand(t *testing.T) {
	ctx, cancel := context.WithCancel(testCtx(t))
	pr, pw := io.Pipe()
	exited := make(chan int, 1)
	go func() {
		exited <- realMain(ctx, []string{"floor", "-token", testToken}, io.Discard, pw)
		pw.Close()
	}()
	line := make([]byte, 4096)
	n, err := pr.Read(line)
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, pr)
	_, rest, ok := bytes.Cut(line[:n], []byte(`"msg":"floor listening","url":"`))
	url, _, ok2 := bytes.Cut(rest, []byte(`"`))
	if !ok || !ok2 {
		t.Fatalf("log line %q", line[:n])
	}
	c, err := client.Dial(testCtx(t), string(url), client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, err := c.Hello(testCtx(t), testToken, protocol.Device{ID: "tel-1"}, protocol.User{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestSweepOnTheFloor: the roundtrip and hello scenarios' floor sides over
// real sockets: every operation at a low rate is answered.
func TestSweepOnTheFloor(t *testing.T) {
	f := startTestFloor(t)
	cfg := stepConfig{Token: testToken, Phones: 5, Rates: []float64{50, 100}, Step: 300 * time.Millisecond,
		Rule: stepRule{MinAchieved: 0.5, P99Max: 2 * time.Second, MissAfter: 5 * time.Second}, Batch: 10, InFlight: 50, Sources: 3, RunID: "tf" + randomHex(2)}
	for _, name := range []string{"roundtrip", "cron", "hello"} {
		w := runSweep(testCtx(t), cfg, name, true, []string{f.URL()}, t.Logf)
		if w.Failed != "" || len(w.Steps) != 2 || w.Saturated || w.Sustained != 100 {
			t.Fatalf("%s: %+v", name, w)
		}
		for _, s := range w.Steps {
			if s.Sent != int(s.Offered*0.3) || s.Done != s.Sent || s.Missed+s.Failed != 0 || s.P50 <= 0 || len(s.Errors) != 0 {
				t.Fatalf("%s at %g/s: %+v, want every one of %d done", name, s.Offered, s, int(s.Offered*0.3))
			}
		}
	}
}

// TestStepsAgainstAGateway runs every scenario at low rates against an
// in-process node (router, demo agent, router API) and the in-process floor:
// every operation is answered on both, and the ratios are computed.
func TestStepsAgainstAGateway(t *testing.T) {
	g := startNode(t, nil)
	cfg := stepConfig{Scenarios: scenarios, URLs: []string{g.URL()}, Token: testToken, Phones: 6, Rates: []float64{20, 40},
		Step: 300 * time.Millisecond, Rule: stepRule{MinAchieved: 0.5, P99Max: 3 * time.Second, MissAfter: 5 * time.Second},
		Floor: "auto", DeliverURL: g.APIURL(), DeliverToken: testDeliver, Batch: 10, InFlight: 50, Sources: 4, RunID: "ts" + randomHex(2)}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	rep, ok := runSteps(testCtx(t), cfg, &progress)
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Logf("\n%s\n%s", progress.String(), table.String())
	if !ok || len(rep.Scenarios) != len(scenarios) {
		t.Fatalf("ok %v, %d scenarios", ok, len(rep.Scenarios))
	}
	for _, sc := range rep.Scenarios {
		for _, w := range []*Sweep{sc.Gateway, sc.FloorW} {
			if w == nil || w.Failed != "" || len(w.Steps) != 2 || w.Sustained != 40 {
				t.Fatalf("%s: sweep %+v", sc.Name, w)
			}
			for _, s := range w.Steps {
				if s.Done != s.Sent || s.Sent == 0 || len(s.Errors) != 0 {
					t.Fatalf("%s on the %s at %g/s: %d of %d done, errors %v", sc.Name, w.Target, s.Offered, s.Done, s.Sent, s.Errors)
				}
			}
		}
		if sc.Ratio == nil || sc.Ratio.Bound != "?" || sc.Ratio.Sustained != 1 || sc.Ratio.Peak <= 0 {
			t.Fatalf("%s: ratio %+v, want 1 with an unknown bound (neither saturated)", sc.Name, sc.Ratio)
		}
	}
	for _, want := range []string{"roundtrip: text", "deliver: POST /v1/deliver", "deliver-batch: POST /v1/deliver/batch", "cron: deliver frames", "hello: dial", "sustained: gateway ≥ 40/s"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

func TestStepExitStatuses(t *testing.T) {
	var out, errs bytes.Buffer
	if code := realMain(context.Background(), []string{"step", "-token", "t", "-rates", "200,100"}, &out, &errs); code != exitUsage || !strings.Contains(errs.String(), "must increase") {
		t.Fatalf("exit %d, %s; want %d naming the rates", code, errs.String(), exitUsage)
	}
	errs.Reset()
	// Nothing listens there: the phones cannot connect.
	code := realMain(context.Background(), []string{"step", "-token", "t", "-url", "ws://127.0.0.1:1/ws", "-floor", "off", "-phones", "1", "-rates", "10", "-step", "100ms"}, &out, &errs)
	if code != exitFailed || !strings.Contains(out.String(), "could not run") {
		t.Fatalf("exit %d, %s; want %d and could not run", code, out.String(), exitFailed)
	}
}
