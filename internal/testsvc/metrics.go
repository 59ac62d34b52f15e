package testsvc

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ScrapeText GETs url (a /metrics endpoint) and returns the exposition,
// failing t unless the answer is 200.
func ScrapeText(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return string(b)
}

// MetricsText serves GET /metrics with h in process and returns the
// exposition, failing t unless the answer is 200.
func MetricsText(t testing.TB, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// Scrape GETs url and returns its samples: `name{labels}` exactly as
// written (labels in the order the exposition gives them, which the
// Prometheus client sorts by name) → value.
func Scrape(t testing.TB, url string) map[string]float64 {
	t.Helper()
	m, err := ParseSamples(ScrapeText(t, url))
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return m
}

// Samples is Scrape of h served in process.
func Samples(t testing.TB, h http.Handler) map[string]float64 {
	t.Helper()
	m, err := ParseSamples(MetricsText(t, h))
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return m
}

// ParseSamples reads a Prometheus text exposition: every line that is not
// a comment is `name{labels} value` (an optional timestamp after the value
// is dropped), keyed as written. A line whose value is not a number is an
// error, as is a key written twice.
func ParseSamples(text string) (map[string]float64, error) {
	out := make(map[string]float64)
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		// The key ends at the space after the labels' closing brace (a
		// label value may hold spaces), or at the first space.
		end := strings.IndexByte(line, ' ')
		if i := strings.IndexByte(line, '{'); i >= 0 && (end < 0 || i < end) {
			j := strings.LastIndexByte(line, '}')
			if j < 0 {
				return nil, fmt.Errorf("unterminated labels in %q", line)
			}
			end = j + 1
		}
		if end <= 0 || end >= len(line) || line[end] != ' ' {
			return nil, fmt.Errorf("no value in %q", line)
		}
		key := line[:end]
		fields := strings.Fields(line[end:])
		if len(fields) == 0 || len(fields) > 2 {
			return nil, fmt.Errorf("unreadable sample %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("unreadable sample %q: %v", line, err)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("sample %s written twice", key)
		}
		out[key] = v
	}
	return out, nil
}

// Want is a condition on a sample's value, for WaitMetric.
type Want struct {
	desc string
	ok   func(float64) bool
}

func (w Want) String() string { return w.desc }

// AtLeast holds once the value is v or more.
func AtLeast(v float64) Want {
	return Want{"≥ " + strconv.FormatFloat(v, 'g', -1, 64), func(x float64) bool { return x >= v }}
}

// Equals holds while the value is v.
func Equals(v float64) Want {
	return Want{"= " + strconv.FormatFloat(v, 'g', -1, 64), func(x float64) bool { return x == v }}
}

// WaitMetric scrapes url until sample satisfies want, and returns that
// scrape; after limit (scaled by Slack) it fails t with the sample, what
// was wanted and its last value. An absent sample counts as 0.
func WaitMetric(t testing.TB, limit time.Duration, url, sample string, want Want) map[string]float64 {
	t.Helper()
	var m map[string]float64
	if !Eventually(limit, func() bool {
		m = Scrape(t, url)
		return want.ok(m[sample])
	}) {
		t.Fatalf("waited %v for %s %s: it is %v", Slack(limit), sample, want, m[sample])
	}
	return m
}
