package deploy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/prometheus/model/labels"
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

// TestChartAlerts renders the PrometheusRule and the Grafana dashboard of
// the production values (which turn both on) and parses every expression in
// them as PromQL. Every metric they name is one docs/metrics.md lists
// (histograms by their _bucket, _count and _sum series), or a standard Go,
// process or scrape series; and it is served by a running edge and router
// of a cluster (servedMetrics): an alert's selector by each service its job
// matcher selects, a dashboard's by at least one. An alert on one service's
// job names series that service records (by their side in docs/metrics.md),
// and the alerts watch the router's own series as well as the edge's.
// Every alert waits (for:) and links its runbook (runbook_url), a section
// of docs/operations.md headed by the alert's name (checkRunbooks, with the
// other rules of the alerts).
func TestChartAlerts(t *testing.T) {
	ms := renderStrict(t, "hermes", "-f", filepath.Join(chart, "values-production.yaml"))
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
			name := histogramSeries.ReplaceAllString(vs.Name, "")
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
	checkRunbooks(t, rules[0])
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
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
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
	variables := map[string]bool{}
	for _, v := range d.Templating.List {
		variables[v.Name] = true
	}
	for _, name := range []string{"namespace", "release", "job"} {
		if !variables[name] {
			t.Errorf("the dashboard has no %s variable (it has %v)", name, keys(variables))
		}
	}
	var exprs int
	for _, panel := range d.Panels {
		for _, target := range panel.Targets {
			exprs++
			for _, sel := range []string{`namespace=~"$namespace"`, `release=~"$release"`, `job=~"$job"`} {
				if !strings.Contains(target.Expr, sel) {
					t.Errorf("dashboard panel %s: %q does not select %s", panel.Title, target.Expr, sel)
				}
			}
			check("dashboard panel "+panel.Title, dashboardVariable.Replace(target.Expr))
		}
	}
	if exprs < 5 {
		t.Errorf("dashboard has %d expressions", exprs)
	}
}

// histogramSeries is the suffix of a histogram's series.
var histogramSeries = regexp.MustCompile(`_(bucket|count|sum)$`)

// dashboardVariable replaces the dashboard's variables with what they
// stand for when "All" is chosen, so its expressions parse and select this
// release's jobs.
var dashboardVariable = strings.NewReplacer(`"$namespace"`, `".*"`, `"$release"`, `".*"`, `"$job"`, `".*"`)

// checkRunbooks checks the rules of every alert beyond its expression's
// series: it waits (for:, a duration); its runbook_url is docs/operations.md
// at the anchor of a heading that is the alert's name (GitHub's slug of
// it), and no two alerts share a section; an alert on a ratio of rates or
// on a quantile has a minimum-traffic guard ("… and <traffic> > n"); up is
// judged per service (aggregated by job, or absent()), and some alert
// fires when a service's targets vanish (absent(up{job=…}) for each job).
func checkRunbooks(t *testing.T, rule *prometheusRule) {
	ops, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(ops))
	if !anchors["alerts"] {
		t.Fatalf("docs/operations.md has no Alerts section (anchors %v)", keys(anchors))
	}
	p := parser.NewParser(parser.Options{})
	seen := map[string]string{} // anchor → alert
	absentJobs := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("alert %s: for %q, want a duration it must hold for", r.Alert, r.For)
			}
			u, err := url.Parse(r.Annotations["runbook_url"])
			switch {
			case err != nil || u.Scheme != "https" || !strings.HasSuffix(u.Path, "/docs/operations.md"):
				t.Errorf("alert %s: runbook_url %q, want docs/operations.md#<section>", r.Alert, r.Annotations["runbook_url"])
			case u.Fragment != strings.ToLower(r.Alert):
				t.Errorf("alert %s: runbook_url %q, want the anchor of its own section, #%s", r.Alert, u, strings.ToLower(r.Alert))
			case !anchors[u.Fragment]:
				t.Errorf("alert %s: runbook_url %q: docs/operations.md has no heading with the anchor #%s", r.Alert, u, u.Fragment)
			case seen[u.Fragment] != "":
				t.Errorf("alerts %s and %s share the runbook #%s", seen[u.Fragment], r.Alert, u.Fragment)
			}
			seen[u.Fragment] = r.Alert
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				continue // TestChartAlerts reports it
			}
			var ratio bool
			parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
				switch n := n.(type) {
				case *parser.BinaryExpr:
					if n.Op == parser.DIV && hasRate(n) {
						ratio = true
					}
				case *parser.Call:
					if n.Func.Name == "histogram_quantile" {
						ratio = true
					}
				case *parser.VectorSelector:
					if n.Name != "up" {
						break
					}
					perService := false
					for _, a := range path {
						if c, ok := a.(*parser.Call); ok && c.Func.Name == "absent" {
							perService = true
							for _, m := range n.LabelMatchers {
								if m.Name == "job" && m.Type == labels.MatchEqual {
									absentJobs[m.Value] = true
								}
							}
						}
						if ag, ok := a.(*parser.AggregateExpr); ok && !ag.Without && slices.Equal(ag.Grouping, []string{"job"}) {
							perService = true
						}
					}
					if !perService {
						t.Errorf("alert %s: %q judges up per target, want it per service (by (job))", r.Alert, r.Expr)
					}
				}
				return nil
			})
			if top, ok := e.(*parser.BinaryExpr); ratio && (!ok || top.Op != parser.LAND || !isGuard(top.RHS)) {
				t.Errorf("alert %s: %q is a ratio or quantile without a minimum-traffic guard (… and sum(rate(…)) > n)", r.Alert, r.Expr)
			}
		}
	}
	for _, job := range []string{"hermes-hermes-gateway-edge-admin", "hermes-hermes-gateway-router-admin"} {
		if !absentJobs[job] {
			t.Errorf("no alert on absent(up{job=%q}): a vanished target would go unnoticed", job)
		}
	}
	for anchor := range anchors {
		// Every section under Alerts is some alert's: a renamed alert
		// leaves no stale runbook behind.
		if strings.HasPrefix(anchor, "hermes") && seen[anchor] == "" {
			t.Errorf("docs/operations.md has a runbook #%s for no alert", anchor)
		}
	}
}

// hasRate says whether n contains a rate() or increase().
func hasRate(n parser.Node) bool {
	found := false
	parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
		if c, ok := n.(*parser.Call); ok && (c.Func.Name == "rate" || c.Func.Name == "increase") {
			found = true
		}
		return nil
	})
	return found
}

// isGuard says whether e is "<traffic> > n" with a positive number n.
func isGuard(e parser.Expr) bool {
	if p, ok := e.(*parser.ParenExpr); ok {
		e = p.Expr
	}
	b, ok := e.(*parser.BinaryExpr)
	if !ok || b.Op != parser.GTR {
		return false
	}
	n, ok := b.RHS.(*parser.NumberLiteral)
	return ok && n.Val > 0
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown document (outside code blocks): the heading's text in lower
// case, without punctuation other than "-" and "_", spaces made "-"; a
// repeated anchor gets "-1", "-2", ….
func headingAnchors(doc string) map[string]bool {
	anchors := map[string]bool{}
	count := map[string]int{}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		text, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fenced || !strings.HasPrefix(line, "#") || !ok {
			continue
		}
		slug := githubSlug(text)
		if n := count[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		count[slug]++
	}
	return anchors
}

// githubSlug is GitHub's anchor for a heading's text.
func githubSlug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGithubSlug checks the anchors against headings GitHub renders.
func TestGithubSlug(t *testing.T) {
	for text, want := range map[string]string{
		"HermesServiceDown":                 "hermesservicedown",
		"Traces (OTLP)":                     "traces-otlp",
		"Docker Compose (one host)":         "docker-compose-one-host",
		"The router API and its tokens":     "the-router-api-and-its-tokens",
		"What phones see, and what is kept": "what-phones-see-and-what-is-kept",
		"`MOBILE_TOKEN` rotation":           "mobile_token-rotation",
	} {
		if got := githubSlug(text); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", text, got, want)
		}
	}
	a := headingAnchors("# A\n## Kubernetes\n```\n# not a heading\n```\n### Kubernetes\n")
	if !a["a"] || !a["kubernetes"] || !a["kubernetes-1"] || a["not-a-heading"] || len(a) != 3 {
		t.Errorf("headingAnchors: %v", a)
	}
}
