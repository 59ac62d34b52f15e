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

// TestChartAlerts renders the PrometheusRule and the Grafana dashboard and
// parses every expression in them as PromQL; every metric they name is one
// docs/metrics.md lists (histograms by their _bucket series), or a standard
// Go, process or scrape series.
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
