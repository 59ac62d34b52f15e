package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The server metrics the report shows, from the standard Go and process
// collectors of each service's /metrics.
const (
	metricRSS        = "process_resident_memory_bytes"
	metricGoroutines = "go_goroutines"
)

// metricsTimeout bounds one read of a /metrics page.
const metricsTimeout = 3 * time.Second

// metricsMaxBytes bounds a /metrics page the load generator reads.
const metricsMaxBytes = 8 << 20

// ServerSample is what one server's /metrics said at one point of the run.
// RSS and Goroutines are nil when the page could not be read or lacks them
// (the table shows n/a).
type ServerSample struct {
	Name       string   `json:"name"` // as given in -metrics name=url, else the URL's host:port
	URL        string   `json:"url"`
	When       string   `json:"when"` // "start" (before connecting), "idle" (after the soak) or "end"
	RSSBytes   *float64 `json:"rss_bytes"`
	Goroutines *float64 `json:"goroutines"`
	Error      string   `json:"error,omitempty"`
}

// scrape reads the RSS and goroutines of target, "url" or "name=url".
func scrape(ctx context.Context, target, when string) ServerSample {
	name, url := metricsTarget(target)
	s := ServerSample{Name: name, URL: url, When: when}
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.Error = "HTTP " + resp.Status
		return s
	}
	vals, err := parseMetrics(io.LimitReader(resp.Body, metricsMaxBytes), metricRSS, metricGoroutines)
	if err != nil {
		s.Error = err.Error()
		return s
	}
	s.RSSBytes, s.Goroutines = vals[metricRSS], vals[metricGoroutines]
	var missing []string
	for _, name := range []string{metricRSS, metricGoroutines} {
		if vals[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		s.Error = "no " + strings.Join(missing, ", ")
	}
	return s
}

// parseMetrics reads the Prometheus text format and returns the values of
// the named metrics that have no labels (or their first series).
func parseMetrics(r io.Reader, names ...string) (map[string]*float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]*float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			// Labels may hold spaces: the value follows the closing brace.
			j := strings.LastIndexByte(line, '}')
			if j < 0 {
				continue
			}
			name, rest, ok = line[:i], strings.TrimSpace(line[j+1:]), true
		}
		if !ok || !want[name] || out[name] != nil {
			continue
		}
		field, _, _ := strings.Cut(strings.TrimSpace(rest), " ") // a timestamp may follow
		v, err := strconv.ParseFloat(field, 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %s: %q is not a number", name, field)
		}
		out[name] = &v
	}
	return out, sc.Err()
}

// metricsTarget splits "name=url" of -metrics; a bare URL is named by its
// host and port.
func metricsTarget(target string) (name, rawURL string) {
	if n, u, ok := strings.Cut(target, "="); ok && !strings.Contains(n, "/") {
		return n, u
	}
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		return u.Host, target
	}
	return target, target
}
