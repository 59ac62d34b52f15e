package main

// Flood mode: cron deliveries with a ttl to made-up devices that never
// connect, as fast as asked, so that each is kept in an outbox. It is what
// an owner filling the store with its sleeping devices' output looks like
// to the other owners of a deployment (loadtest/fairness.sh).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/secret"
)

// floodConfig is a flood run.
type floodConfig struct {
	URL      string // the router's API
	Token    string // a deliver token or an owner's deliver key
	Devices  int
	Rate     float64
	Bytes    int
	Duration time.Duration
	TTL      int
	RunID    string
}

// floodResult counts the answers by status ("202 queued", "429", "error").
type floodResult map[string]int

func (r floodResult) String() string {
	var keys []string
	for k := range r {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, r[k])
	}
	return strings.TrimSpace(b.String())
}

// flood posts cfg.Rate deliveries a second for cfg.Duration, each a text of
// cfg.Bytes with cfg.TTL to device flood-<run>-<i mod Devices>, from
// deliverWorkers requests in flight at most, and counts the answers.
func flood(ctx context.Context, cfg floodConfig) floodResult {
	hc := &http.Client{Timeout: deliverTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: deliverWorkers}}
	defer hc.CloseIdleConnections()
	text := strings.Repeat("f", cfg.Bytes)
	res := make(floodResult)
	var mu sync.Mutex
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range deliverWorkers {
		wg.Go(func() {
			for i := range jobs {
				body, _ := json.Marshal(map[string]any{
					"target": fmt.Sprintf("flood-%s-%d", cfg.RunID, i%cfg.Devices),
					"id":     fmt.Sprintf("flood-%s.%d", cfg.RunID, i),
					"text":   text, "ttl": cfg.TTL,
				})
				kind := floodPost(ctx, hc, cfg, body)
				mu.Lock()
				res[kind]++
				mu.Unlock()
			}
		})
	}
	n := 0
	pace(ctx, cfg.Rate, cfg.Duration, func() bool {
		select {
		case jobs <- n:
			n++
			return true
		case <-ctx.Done():
			return false
		}
	})
	close(jobs)
	wg.Wait()
	return res
}

// floodPost posts one delivery and names its answer.
func floodPost(ctx context.Context, hc *http.Client, cfg floodConfig, body []byte) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/v1/deliver", bytes.NewReader(body))
	if err != nil {
		return "error"
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "error"
	}
	defer resp.Body.Close()
	var a struct {
		Queued bool `json:"queued"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&a) // not JSON: not queued
	if resp.StatusCode == http.StatusAccepted && a.Queued {
		return "202_queued"
	}
	return fmt.Sprint(resp.StatusCode)
}

// floodMain is `loadtest flood`.
func floodMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg floodConfig
	var token secret.Secret
	fs.StringVar(&cfg.URL, "deliver", "http://127.0.0.1:8788", "the router's API base URL")
	config.Secret(fs, &token, "deliver-token", "LOADTEST_DELIVER_TOKEN", "a deliver token, or an owner's deliver key")
	fs.IntVar(&cfg.Devices, "devices", 100, "made-up devices the deliveries go to in turn")
	fs.Float64Var(&cfg.Rate, "rate", 100, "deliveries per second")
	fs.IntVar(&cfg.Bytes, "bytes", 10000, "characters of each delivery's text (at most 12,000)")
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long to flood")
	fs.IntVar(&cfg.TTL, "ttl", 3600, "each delivery's ttl, in seconds")
	fs.StringVar(&cfg.RunID, "run", "", "run id in the device ids; random when empty")
	if err := config.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadtest flood:", err)
		return exitUsage
	}
	cfg.Token = string(token)
	switch {
	case cfg.Token == "":
		fmt.Fprintln(stderr, "loadtest flood: -deliver-token is required")
		return exitUsage
	case cfg.Devices < 1 || cfg.Rate <= 0 || cfg.Bytes < 1 || cfg.Bytes > 12000 || cfg.TTL < 1:
		fmt.Fprintln(stderr, "loadtest flood: -devices, -rate and -ttl must be positive, -bytes from 1 to 12000")
		return exitUsage
	}
	if cfg.RunID == "" {
		cfg.RunID = randomHex(3)
	}
	res := flood(ctx, cfg)
	fmt.Fprintf(stdout, "flood: %d devices, %d bytes each, %.0f/s for %v: %s\n", cfg.Devices, cfg.Bytes, cfg.Rate, cfg.Duration, res)
	return 0
}
