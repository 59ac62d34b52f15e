// Command loadtest is the load generator of the gateway. It connects many
// devices to one or more edges on loopback, from many 127.0.0.x source
// addresses, holds them idle for a soak, sends texts at a target rate (and,
// with -deliver, router deliveries), drops a fraction of the connections at
// once and measures how fast they are back, then reports connections held,
// handshake and message rates, latencies (p50, p99, p99.9, from timestamps
// inside the messages), errors by code and the servers' RSS and goroutines,
// as a table and as JSON. It exits 1 when anything was lost or failed.
//
//	go run ./loadtest -url ws://127.0.0.1:8787/ws -token "$MOBILE_TOKEN" -conns 2000 -duration 30s
//	go run ./loadtest merge a.json b.json    # several processes' reports as one
//	go run ./loadtest step -scenario roundtrip -url ws://127.0.0.1:8787/ws -token "$MOBILE_TOKEN"
//	go run ./loadtest floor -token "$MOBILE_TOKEN"  # the bare reference server
//	go run ./loadtest sidebyside -target gw=gateway,ws://…/ws,http://… -target cf=centrifugo,ws://…,http://…
//	go run ./loadtest flood -deliver http://127.0.0.1:8788 -deliver-token "$KEY"  # queued deliveries to made-up devices
//
// Step mode offers increasing rates of one kind of operation (round trips
// through the agent, router deliveries, deliver frames from one
// connection, handshakes) until the gateway saturates, and does the same
// against the floor, a bare gobwas hello/ping server, so that every rate is
// also a ratio to what the machine and the client can do at all.
//
// See loadtest/README.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hermes-mobile/gateway/pkg/config"
)

// Exit statuses.
const (
	exitFailed = 1 // the run lost something or saw errors
	exitUsage  = 2 // the run could not start
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(realMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// realMain runs the command with args and returns its exit status.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "merge":
			return mergeMain(args[1:], stdout, stderr)
		case "step":
			return stepMain(ctx, args[1:], stdout, stderr)
		case "floor":
			return floorMain(ctx, args[1:], stderr)
		case "sidebyside":
			return sbsMain(ctx, args[1:], stdout, stderr)
		case "flood":
			return floodMain(ctx, args[1:], stdout, stderr)
		}
	}
	var f flagSet
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.RegisterFlags(fs)
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitUsage
	}
	cfg, err := f.Config()
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitUsage
	}
	rep, err := run(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "loadtest:", err)
		return exitUsage
	}
	return finish(rep, cfg.JSONPath, stdout, stderr)
}

// finish prints the table, writes the JSON and turns the verdict into an
// exit status.
func finish(rep *Report, jsonPath string, stdout, stderr io.Writer) int {
	_ = rep.WriteTable(stdout) // the JSON and the exit status still say it all
	if jsonPath != "" {
		if err := rep.writeJSON(jsonPath); err != nil {
			fmt.Fprintln(stderr, "loadtest:", err)
			return exitUsage
		}
	}
	if !rep.OK {
		return exitFailed
	}
	return 0
}

// mergeMain merges the JSON reports of runs that ran side by side.
func mergeMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest merge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonPath := fs.String("json", "", "also write the merged report as JSON to this file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: loadtest merge [-json out.json] report.json ...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	merged := newReport()
	for _, p := range fs.Args() {
		r, err := readReport(p)
		if err != nil {
			fmt.Fprintln(stderr, "loadtest merge:", err)
			return exitUsage
		}
		merged.Merge(r)
	}
	return finish(merged, *jsonPath, stdout, stderr)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
