package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
)

// documentedMetric finds the metric names docs/metrics.md lists in its tables.
var documentedMetric = regexp.MustCompile("(?m)^\\| `([a-z_]+)`")

// documentedSide finds the side of each gateway metric in docs/metrics.md.
var documentedSide = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| (?:counter|gauge|histogram) \\|[^|]*\\| ([a-zA-Z ]+) \\|")

// recordedBy says which documented sides each service records; an alert on
// one service's job must name a series of one of its sides (a router also
// serves the edge's counters, at 0, and an edge the router's).
var recordedBy = map[string]map[string]bool{
	"edge":   {"edge": true, "both": true, "Redis": true},
	"router": {"router": true, "router API": true, "both": true, "Redis": true},
}

// TestChartAlerts renders the PrometheusRule and the Grafana dashboard and
// parses every expression in them as PromQL. Every metric they name is one
// docs/metrics.md lists (histograms by their _bucket series), or a standard
// Go, process or scrape series; and it is served by a running edge and
// router of a cluster (servedMetrics): an alert's selector by each service
// its job matcher selects, a dashboard's by at least one. An alert on one
// service's job names series that service records (by their side in
// docs/metrics.md), and the alerts watch the router's own series as well as
// the edge's.
func TestChartAlerts(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken,
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.grafanaDashboard.enabled=true")
	docs, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range documentedMetric.FindAllStringSubmatch(string(docs), -1) {
		documented[m[1]] = true
	}
	if !documented["hermes_connections"] {
		t.Fatalf("docs/metrics.md lists no hermes_connections: %v", keys(documented))
	}
	side := map[string]string{}
	for _, m := range documentedSide.FindAllStringSubmatch(string(docs), -1) {
		side[m[1]] = m[2]
	}
	if side["hermes_http_requests_total"] != "router API" || side["hermes_closes_total"] != "edge" {
		t.Fatalf("docs/metrics.md's sides were not read: %v", side)
	}
	served := servedMetrics(t)
	const fullname = "hermes-hermes-gateway"
	jobs := map[string]string{"edge": fullname + "-edge-admin", "router": fullname + "-router-admin"}
	watched := map[string]bool{} // service → an alert selects its hermes_ series
	p := parser.NewParser(parser.Options{})
	check := func(where, expr string) {
		t.Helper()
		e, err := p.ParseExpr(expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, expr, err)
			return
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := strings.TrimSuffix(vs.Name, "_bucket")
			if !documented[name] && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && name != "up" {
				t.Errorf("%s: %q names %s, which docs/metrics.md does not list", where, expr, vs.Name)
			}
			if vs.Name == "up" { // Prometheus's own, per target
				return nil
			}
			var selected []string
			for service, job := range jobs {
				ok := true
				for _, m := range vs.LabelMatchers {
					if m.Name == "job" && !m.Matches(job) {
						ok = false
					}
				}
				if ok {
					selected = append(selected, service)
				}
			}
			if s, ok := side[name]; ok && len(selected) == 1 && strings.HasPrefix(where, "alert ") && !recordedBy[selected[0]][s] {
				t.Errorf("%s: %q selects %s from the %s, which does not record it (docs/metrics.md: side %s)", where, expr, vs.Name, selected[0], s)
			}
			found := false
			for _, service := range selected {
				if served[service][vs.Name] {
					found = true
					if strings.HasPrefix(where, "alert ") && strings.HasPrefix(vs.Name, "hermes_") && len(selected) == 1 {
						watched[service] = true
					}
				} else if strings.HasPrefix(where, "alert ") {
					t.Errorf("%s: %q selects %s from the %s, which does not serve it", where, expr, vs.Name, service)
				}
			}
			switch {
			case len(selected) == 0:
				t.Errorf("%s: %q selects %s from no job of this release", where, expr, vs.Name)
			case !found && !strings.HasPrefix(where, "alert "):
				t.Errorf("%s: %q names %s, which neither a running edge nor a running router serves", where, expr, vs.Name)
			}
			return nil
		})
	}

	rules := all[prometheusRule](ms)
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(rules))
	}
	var n int
	for _, g := range rules[0].Spec.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: want an alert name, a severity and a summary", r)
			}
			check("alert "+r.Alert, r.Expr)
			// Every selector is this release's (the ServiceMonitor's job).
			if !strings.Contains(r.Expr, `job="hermes-hermes-gateway-`) && !strings.Contains(r.Expr, `job=~"hermes-hermes-gateway-`) {
				t.Errorf("alert %s: %q does not select this release's jobs", r.Alert, r.Expr)
			}
		}
	}
	if n < 5 {
		t.Errorf("%d alerts, want those docs/operations.md describes", n)
	}
	for service := range jobs {
		if !watched[service] {
			t.Errorf("no alert selects a hermes_ series of the %s alone", service)
		}
	}

	var dash *corev1.ConfigMap
	for _, cm := range all[corev1.ConfigMap](ms) {
		if cm.Data["hermes-gateway.json"] != "" {
			dash = cm
		}
	}
	if dash == nil || dash.Labels["grafana_dashboard"] != "1" {
		t.Fatalf("no dashboard ConfigMap labelled for Grafana's sidecar: %+v", dash)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dash.Data["hermes-gateway.json"]), &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var exprs int
	for _, panel := range d.Panels {
		for _, target := range panel.Targets {
			exprs++
			check("dashboard panel "+panel.Title, target.Expr)
		}
	}
	if exprs < 5 {
		t.Errorf("dashboard has %d expressions", exprs)
	}
}
