package deploy

import (
	"bytes"
	"cmp"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// testDigest is an image digest the renders below pin images by.
const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestChartCrossField: the rules between two values that values.schema.json
// cannot state fail the render with a message naming both values, at the
// boundary: equal values render, one past fails.
func TestChartCrossField(t *testing.T) {
	tok := []string{"--set", "auth.token=" + testToken}
	routerHPA := []string{"--set", "router.autoscaling.enabled=true"}
	sm := []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.interval=30s"}
	ok := [][]string{
		{"--set", "edge.autoscaling.minReplicas=3", "--set", "edge.autoscaling.maxReplicas=3"},
		append(routerHPA, "--set", "router.autoscaling.minReplicas=4", "--set", "router.autoscaling.maxReplicas=4"),
		append(sm, "--set", "metrics.serviceMonitor.scrapeTimeout=30s"),
		append(sm, "--set", "metrics.serviceMonitor.scrapeTimeout=30000ms"),
		// A disabled HPA's numbers are not checked.
		{"--set", "router.autoscaling.minReplicas=4", "--set", "router.autoscaling.maxReplicas=3"},
	}
	for _, args := range ok {
		if _, err := helmTemplate(t, "hermes", append(tok, args...)...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "edge.autoscaling.minReplicas=3", "--set", "edge.autoscaling.maxReplicas=2"},
			"edge.autoscaling.maxReplicas (2) is below edge.autoscaling.minReplicas (3)"},
		{append(routerHPA, "--set", "router.autoscaling.minReplicas=4", "--set", "router.autoscaling.maxReplicas=3"),
			"router.autoscaling.maxReplicas (3) is below router.autoscaling.minReplicas (4)"},
		{append(sm, "--set", "metrics.serviceMonitor.scrapeTimeout=31s"),
			"metrics.serviceMonitor.scrapeTimeout 31s is longer than metrics.serviceMonitor.interval 30s"},
		{append(sm, "--set", "metrics.serviceMonitor.scrapeTimeout=30001ms"),
			"metrics.serviceMonitor.scrapeTimeout 30001ms is longer than metrics.serviceMonitor.interval 30s"},
	}
	for _, tc := range bad {
		_, err := helmTemplate(t, "hermes", append(tok, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}

// TestChartOpenAIModel: agent openai needs a model (an if/then of the
// schema); the other agents do not.
func TestChartOpenAIModel(t *testing.T) {
	tok := []string{"--set", "auth.token=" + testToken}
	if _, err := helmTemplate(t, "hermes", append(tok, "--set", "router.agent=openai")...); err == nil ||
		!strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), "/router/openai") {
		t.Errorf("agent openai without a model: %v, want a schema error naming /router/openai/model", err)
	}
	for _, args := range [][]string{
		{"--set", "router.agent=openai", "--set", "router.openai.model=gpt-4o-mini"},
		{"--set", "router.agent=link"},
	} {
		if _, err := helmTemplate(t, "hermes", append(tok, args...)...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestChartImageDigest: image.digest pins every container of the chart's
// image by digest in place of the tag; the bundled Redis and NATS take a
// digest in their image; a malformed digest is refused by the schema.
func TestChartImageDigest(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "image.digest="+testDigest,
		"--set", "redis.image=valkey/valkey:8-alpine@"+testDigest, "--set", "nats.image=nats:2.15-alpine@"+testDigest)
	want := map[string]string{
		"edge":   "ghcr.io/hermes-mobile/gateway@" + testDigest,
		"router": "ghcr.io/hermes-mobile/gateway@" + testDigest,
		"redis":  "valkey/valkey:8-alpine@" + testDigest,
		"nats":   "nats:2.15-alpine@" + testDigest,
	}
	for component, image := range want {
		if got := deployment(t, ms, component).Spec.Template.Spec.Containers[0].Image; got != image {
			t.Errorf("%s image %q, want %q", component, got, image)
		}
	}
	ms = renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "image.tag=1.2.3")
	if got := deployment(t, ms, "edge").Spec.Template.Spec.Containers[0].Image; got != "ghcr.io/hermes-mobile/gateway:1.2.3" {
		t.Errorf("edge image without a digest %q, want the tag", got)
	}
	for _, bad := range []string{"image.digest=0123abcd", "image.digest=sha256:0123", "redis.image=redis@sha256:0123", "nats.image=nats @" + testDigest} {
		if _, err := helmTemplate(t, "hermes", "--set", "auth.token="+testToken, "--set", bad); err == nil || !strings.Contains(err.Error(), "schema") {
			t.Errorf("%s: %v, want a schema error", bad, err)
		}
	}
}

// TestChartRouterHPA: router.autoscaling.enabled makes an HPA for the
// routers' Deployment, which then leaves its replicas to it.
func TestChartRouterHPA(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "router.autoscaling.enabled=true",
		"--set", "router.autoscaling.minReplicas=3", "--set", "router.autoscaling.maxReplicas=7",
		"--set", "router.autoscaling.targetMemoryUtilizationPercentage=80")
	router := deployment(t, ms, "router")
	if router.Spec.Replicas != nil {
		t.Errorf("router replicas %d with an HPA, want none (the HPA sets them)", *router.Spec.Replicas)
	}
	var hpa *autoscalingv2.HorizontalPodAutoscaler
	for _, h := range all[autoscalingv2.HorizontalPodAutoscaler](ms) {
		if h.Spec.ScaleTargetRef.Name == router.Name {
			hpa = h
		}
	}
	if hpa == nil {
		t.Fatal("no HPA targets the router Deployment")
	}
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 7 || len(hpa.Spec.Metrics) != 2 {
		t.Errorf("router HPA %+v: want the Deployment, 3 to 7 replicas, CPU and memory", hpa.Spec)
	}
	ms = renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "router.replicas=2")
	if r := deployment(t, ms, "router").Spec.Replicas; r == nil || *r != 2 {
		t.Errorf("router replicas %v without an HPA, want router.replicas 2", r)
	}
	for _, h := range all[autoscalingv2.HorizontalPodAutoscaler](ms) {
		if h.Spec.ScaleTargetRef.Name == router.Name {
			t.Error("a router HPA by default")
		}
	}
}

// TestChartServiceMonitorRelabel: the ServiceMonitor labels every series
// with its Helm release (first, so the user's relabelings may use it),
// then applies the user's relabelings and metricRelabelings, and sets the
// scrape timeout.
func TestChartServiceMonitorRelabel(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.scrapeTimeout=20s",
		"--set", "metrics.serviceMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_node_name",
		"--set", "metrics.serviceMonitor.relabelings[0].targetLabel=node",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].action=drop",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].regex=go_memstats_.*")
	sms := all[serviceMonitor](ms)
	if len(sms) != 1 || len(sms[0].Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitors %+v: want one with one endpoint", sms)
	}
	e := sms[0].Spec.Endpoints[0]
	if e.ScrapeTimeout != "20s" {
		t.Errorf("scrapeTimeout %q, want 20s", e.ScrapeTimeout)
	}
	if len(e.Relabelings) != 2 || e.Relabelings[0].TargetLabel != "release" ||
		!slices.Equal(e.Relabelings[0].SourceLabels, []string{"__meta_kubernetes_service_label_app_kubernetes_io_instance"}) ||
		e.Relabelings[1].TargetLabel != "node" {
		t.Errorf("relabelings %+v: want release from the Service's instance label, then node", e.Relabelings)
	}
	if len(e.MetricRelabelings) != 1 || e.MetricRelabelings[0].Action != "drop" || e.MetricRelabelings[0].Regex != "go_memstats_.*" {
		t.Errorf("metricRelabelings %+v: want the drop rule", e.MetricRelabelings)
	}
	// The Services carry the label the release relabeling reads.
	for _, m := range ms {
		if m.Kind == "Service" && strings.HasSuffix(m.Name, "-admin") && !bytes.Contains(m.Raw, []byte("app.kubernetes.io/instance: hermes")) {
			t.Errorf("Service %s has no app.kubernetes.io/instance label for the release relabeling", m.Name)
		}
	}
}

// TestChartNotes: the install notes say how phones reach the edges: the
// Ingress's or HTTPRoute's address when one is on, the load balancer's,
// or that the edges are not exposed.
func TestChartNotes(t *testing.T) {
	tok := []string{"--set", "auth.token=" + testToken}
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{nil, []string{"not exposed outside the cluster", "the bundled Redis and NATS are single pods", `README, "Production state"`},
			[]string{"Ingress hermes", "HTTPRoute hermes"}},
		{[]string{"--set", "redis.bundled=false", "--set", "redis.url=redis://r:6379", "--set", "nats.bundled=false", "--set", "nats.url=nats://n:4222"},
			nil, []string{"WARNING", "bundled"}},
		{[]string{"--set", "ingress.enabled=true", "--set", "ingress.host=gw.example.com", "--set", "ingress.tls[0].secretName=gw-tls"},
			[]string{"Ingress hermes-hermes-gateway-edge", "wss://gw.example.com/ws", "edge.trustedProxies"}, []string{"not exposed"}},
		{[]string{"--set", "httpRoute.enabled=true", "--set", "httpRoute.parentRefs[0].name=public", "--set", "httpRoute.parentRefs[0].namespace=gateways",
			"--set", "httpRoute.hostnames[0]=gw.example.com"},
			[]string{"HTTPRoute hermes-hermes-gateway-edge, attached to gateways/public", "wss://gw.example.com/ws"}, []string{"not exposed"}},
		{[]string{"--set", "edge.service.type=LoadBalancer"}, []string{"EXTERNAL-IP", "ws://<EXTERNAL-IP>:8787/ws"}, []string{"not exposed"}},
	} {
		notes := renderNotes(t, append(tok, tc.args...)...)
		for _, w := range tc.want {
			if !strings.Contains(notes, w) {
				t.Errorf("%v: notes lack %q:\n%s", tc.args, w, notes)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(notes, n) {
				t.Errorf("%v: notes say %q:\n%s", tc.args, n, notes)
			}
		}
	}
}

// renderNotes returns NOTES.txt as helm install would print it. helm
// install needs a cluster even for a dry run, so it renders a copy of the
// chart with one more template: a ConfigMap holding tpl of NOTES.txt.
func renderNotes(t *testing.T, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hermes-gateway")
	if err := os.CopyFS(dir, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// .Files reads the chart's files outside templates/.
	if err := os.WriteFile(filepath.Join(dir, "NOTES.txt"), notes, 0o644); err != nil {
		t.Fatal(err)
	}
	const tmpl = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: {{ tpl (.Files.Get \"NOTES.txt\") . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(helm(t), append([]string{"template", "hermes", dir, "--namespace", "gw", "--kube-version", kubeVersion,
		"--show-only", "templates/zz-notes.yaml"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v: %s", args, err, stderr.String())
	}
	var cm struct {
		Data struct {
			Notes string `json:"notes"`
		} `json:"data"`
	}
	if err := yaml.Unmarshal(out, &cm); err != nil || cm.Data.Notes == "" {
		t.Fatalf("the notes ConfigMap %s: %v", out, err)
	}
	return cm.Data.Notes
}

// TestChartRedisMode: redis.mode reaches both edges and routers as
// REDIS_MODE (through the shared ConfigMap), next to the external REDIS_URL
// and a NATS_URL listing a NATS cluster's servers; cluster and sentinel with
// the bundled Redis (a single server) fail the render saying what to set.
func TestChartRedisMode(t *testing.T) {
	tok := []string{"--set", "auth.token=" + testToken}
	external := []string{"--set", "redis.bundled=false", "--set", "nats.bundled=false",
		"--set", `nats.url=nats://nats-0:4222\,nats://nats-1:4222`}
	cases := []struct {
		mode, url string
	}{
		{"", "redis://r:6379"}, // unset: single
		{"single", "redis://r:6379"},
		{"cluster", "redis://r-0:7000?addr=r-1:7000&addr=r-2:7000"},
		{"sentinel", "redis://s-0:26379?master_name=m&addr=s-1:26379"},
	}
	for _, tc := range cases {
		args := append(slices.Clone(tok), external...)
		args = append(args, "--set-string", "redis.url="+tc.url)
		if tc.mode != "" {
			args = append(args, "--set", "redis.mode="+tc.mode)
		}
		want := map[string]string{"REDIS_MODE": cmp.Or(tc.mode, "single"), "REDIS_URL": tc.url,
			"NATS_URL": "nats://nats-0:4222,nats://nats-1:4222"}
		ms := renderStrict(t, "hermes", args...)
		for _, component := range []string{"edge", "router"} {
			c := deployment(t, ms, component).Spec.Template.Spec.Containers[0]
			for name, value := range want {
				if got := effectiveEnv(t, ms, c, name); got != value {
					t.Errorf("mode %q: %s %s = %q, want %q", tc.mode, component, name, got, value)
				}
			}
		}
	}
	// From a Secret the URL is external too.
	ms := renderStrict(t, "hermes", append(tok, "--set", "redis.bundled=false", "--set", "redis.existingSecret=redis",
		"--set", "redis.mode=sentinel")...)
	if got := effectiveEnv(t, ms, deployment(t, ms, "edge").Spec.Template.Spec.Containers[0], "REDIS_MODE"); got != "sentinel" {
		t.Errorf("with redis.existingSecret: edge REDIS_MODE = %q, want sentinel", got)
	}
	for _, mode := range []string{"cluster", "sentinel"} {
		_, err := helmTemplate(t, "hermes", append(tok, "--set", "redis.mode="+mode)...)
		want := "redis.mode " + mode + " needs an external Redis: set redis.bundled=false and redis.url"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("redis.mode=%s with the bundled Redis: %v, want an error saying %q", mode, err, want)
		}
	}
	if _, err := helmTemplate(t, "hermes", append(tok, "--set", "redis.mode=Cluster")...); err == nil ||
		!strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), "/redis/mode") {
		t.Errorf("redis.mode=Cluster: %v, want a schema error naming /redis/mode", err)
	}
}

// effectiveEnv is the value a container sees for name: its env entry (a
// literal value; "" for one from a Secret), else the ConfigMap of its
// envFrom that has it.
func effectiveEnv(t *testing.T, ms []manifest, c corev1.Container, name string) string {
	t.Helper()
	if e := containerEnv(c, name); e != nil {
		return e.Value
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue
		}
		for _, cm := range all[corev1.ConfigMap](ms) {
			if cm.Name == from.ConfigMapRef.Name {
				if v, ok := cm.Data[name]; ok {
					return v
				}
			}
		}
	}
	return ""
}
