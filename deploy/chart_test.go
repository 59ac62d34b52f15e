package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const chart = root + "/charts/hermes-gateway"

// kubeVersion is the oldest Kubernetes the chart supports (Chart.yaml).
const kubeVersion = "1.30.0"

// helm finds the helm binary: $HELM, then PATH, then
// /tmp/helmbin/<version>/helm (where .ci/helm.sh builds it; the newest
// version there).
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	if built, _ := filepath.Glob("/tmp/helmbin/v*/helm"); len(built) > 0 {
		slices.SortFunc(built, func(a, b string) int {
			return slices.Compare(versionParts(filepath.Base(filepath.Dir(a))), versionParts(filepath.Base(filepath.Dir(b))))
		})
		return built[len(built)-1]
	}
	t.Skip("no helm (set HELM, or run .ci/helm.sh, which installs it)")
	return ""
}

// versionParts are the numbers of "v4.3.2", to order versions.
func versionParts(v string) []int {
	var n []int
	for _, f := range strings.Split(strings.TrimPrefix(v, "v"), ".") {
		i, _ := strconv.Atoi(f)
		n = append(n, i)
	}
	return n
}

// object is one rendered manifest.
type object struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	node yaml.Node
}

func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := o.node.Decode(v); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Metadata.Name, err)
	}
}

// render runs helm template with args and returns the manifests by kind.
func render(t *testing.T, args ...string) map[string][]object {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "hermes", chart, "--namespace", "gw", "--kube-version", kubeVersion}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	objs := map[string][]object{}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o object
		if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template %v: %v", args, err)
		}
		if o.node.Kind == 0 {
			continue
		}
		o.decode(t, &o)
		objs[o.Kind] = append(objs[o.Kind], o)
	}
	return objs
}

type podTemplate struct {
	Spec struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			RollingUpdate struct {
				MaxUnavailable int `yaml:"maxUnavailable"`
				MaxSurge       int `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type container struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []struct {
		ConfigMapRef *struct{ Name string } `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	LivenessProbe  *probeSpec `yaml:"livenessProbe"`
	ReadinessProbe *probeSpec `yaml:"readinessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
	} `yaml:"resources"`
}

type probeSpec struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func (c container) env(name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// workload finds the Deployment of a component and its one container.
func workload(t *testing.T, objs map[string][]object, component string) (podTemplate, container) {
	t.Helper()
	for _, o := range objs["Deployment"] {
		if o.Metadata.Labels["app.kubernetes.io/component"] == component {
			var d podTemplate
			o.decode(t, &d)
			if n := len(d.Spec.Template.Spec.Containers); n != 1 {
				t.Fatalf("%s Deployment has %d containers, want 1", component, n)
			}
			return d, d.Spec.Template.Spec.Containers[0]
		}
	}
	t.Fatalf("no %s Deployment", component)
	return podTemplate{}, container{}
}

// values reads keys of values files; later files win.
func values(t *testing.T, files ...string) map[string]any {
	t.Helper()
	merged := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(chart, f))
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		merge(merged, v)
	}
	return merged
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if m, ok := v.(map[string]any); ok {
			if d, ok := dst[k].(map[string]any); ok {
				merge(d, m)
				continue
			}
		}
		dst[k] = v
	}
}

func intValue(t *testing.T, v map[string]any, path ...string) int {
	t.Helper()
	var cur any = v
	for _, p := range path {
		cur = cur.(map[string]any)[p]
	}
	n, ok := cur.(int)
	if !ok {
		t.Fatalf("values %v = %v, not a number", path, cur)
	}
	return n
}

// TestChart renders the chart as a default install, as the production
// values have it, and with an existing Secret, and checks the manifests:
// the kinds, the probes, the drain (preStop, grace period, MOBILE_DRAIN_WINDOW),
// the security context, and that every variable is one the services accept.
func TestChart(t *testing.T) {
	cases := []struct {
		name           string
		files          []string // values files, after values.yaml
		args           []string
		existingSecret string
		kinds          []string
		absent         []string
	}{
		{
			name:   "default",
			args:   []string{"--set", "auth.token=" + testToken, "--set", "auth.deliverTokens=d", "--set", "auth.agentTokens=a"},
			kinds:  []string{"ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret", "Service"},
			absent: []string{"ServiceMonitor"},
		},
		{
			name:           "production",
			files:          []string{"values-production.yaml"},
			existingSecret: "hermes-tokens",
			kinds:          []string{"ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "ServiceMonitor"},
			absent:         []string{"Secret"},
		},
		{
			name: "existing secret",
			args: []string{"--set", "auth.existingSecret=my-tokens", "--set", "edge.autoscaling.enabled=false", "--set", "edge.pdb.enabled=false", "--set", "router.pdb.enabled=false",
				"--set", "auth.existingSecretKeys.deliverTokens=MOBILE_DELIVER_TOKENS", "--set", "auth.existingSecretKeys.agentTokens=MOBILE_AGENT_TOKENS"},
			existingSecret: "my-tokens",
			kinds:          []string{"ConfigMap", "Deployment", "Service"},
			absent:         []string{"Secret", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := slices.Clone(tc.args)
			for _, f := range tc.files {
				args = append(args, "-f", filepath.Join(chart, f))
			}
			objs := render(t, args...)
			for _, k := range tc.kinds {
				if len(objs[k]) == 0 {
					t.Errorf("no %s rendered (kinds %v)", k, keys(objs))
				}
			}
			for _, k := range tc.absent {
				if len(objs[k]) != 0 {
					t.Errorf("%s rendered, want none", k)
				}
			}
			vals := values(t, append([]string{"values.yaml"}, tc.files...)...)
			checkEdge(t, objs, vals)
			checkRouter(t, objs)
			checkSecretRefs(t, objs, tc.existingSecret)
			for _, cm := range objs["ConfigMap"] {
				if cm.Metadata.Name != "hermes-hermes-gateway" {
					continue // the dashboard's
				}
				// Edges and routers both read the ConfigMap.
				checkEnv(t, "ConfigMap "+cm.Metadata.Name, "edge", keys(cm.Data))
				checkEnv(t, "ConfigMap "+cm.Metadata.Name, "router", keys(cm.Data))
			}
			if len(objs["ServiceMonitor"]) > 0 {
				checkServiceMonitor(t, objs)
			}
		})
	}
}

func checkEdge(t *testing.T, objs map[string][]object, vals map[string]any) {
	d, c := workload(t, objs, "edge")
	checkPod(t, "edge", d, c, "/usr/local/bin/hermes-edge", 8789)
	if v, _ := c.env("MOBILE_ROUTER"); v != "off" {
		t.Errorf("edge MOBILE_ROUTER=%q, want off", v)
	}
	if v, _ := c.env("MOBILE_LISTEN"); v != "0.0.0.0:"+strconv.Itoa(c.port("ws")) {
		t.Errorf("edge MOBILE_LISTEN=%q, port ws %d", v, c.port("ws"))
	}

	drain := intValue(t, vals, "edge", "drainWindowSeconds")
	preStop := intValue(t, vals, "edge", "preStopSleepSeconds")
	margin := intValue(t, vals, "edge", "terminationMarginSeconds")
	if v, _ := c.env("MOBILE_DRAIN_WINDOW"); v != strconv.Itoa(drain) {
		t.Errorf("edge MOBILE_DRAIN_WINDOW=%q, want edge.drainWindowSeconds %d", v, drain)
	}
	if p := c.Lifecycle.PreStop; p == nil || p.Sleep == nil || p.Sleep.Seconds != preStop || preStop <= 0 {
		t.Errorf("edge preStop %s: want a sleep of edge.preStopSleepSeconds (%d)", mustYAML(p), preStop)
	}
	grace := -1
	if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	if want := preStop + drain + margin; grace != want || margin < 15 {
		t.Errorf("edge terminationGracePeriodSeconds %d, want preStop %d + drain window %d + margin %d (at least 15)", grace, preStop, drain, margin)
	}

	for _, s := range objs["Service"] {
		if s.Metadata.Name != "hermes-hermes-gateway-edge" {
			continue
		}
		var svc struct {
			Spec struct {
				SessionAffinity string            `yaml:"sessionAffinity"`
				Selector        map[string]string `yaml:"selector"`
				Ports           []struct {
					Name       string `yaml:"name"`
					TargetPort string `yaml:"targetPort"`
				} `yaml:"ports"`
			} `yaml:"spec"`
		}
		s.decode(t, &svc)
		if svc.Spec.SessionAffinity != "None" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != "ws" {
			t.Errorf("edge Service %+v: want only the ws port, no session affinity", svc.Spec)
		}
		checkSelects(t, "edge Service", svc.Spec.Selector, d.Spec.Template.Metadata.Labels)
	}
	for _, o := range objs["HorizontalPodAutoscaler"] {
		var h struct {
			Spec struct {
				ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
				MinReplicas    int                         `yaml:"minReplicas"`
				Metrics        []struct {
					Resource struct{ Name string } `yaml:"resource"`
				} `yaml:"metrics"`
			} `yaml:"spec"`
		}
		o.decode(t, &h)
		if h.Spec.ScaleTargetRef.Name != "hermes-hermes-gateway-edge" || h.Spec.MinReplicas < 1 || len(h.Spec.Metrics) == 0 || h.Spec.Metrics[0].Resource.Name != "cpu" {
			t.Errorf("HPA %+v: want the edge Deployment scaled on cpu", h.Spec)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("edge Deployment sets replicas %d although the HPA scales it", *d.Spec.Replicas)
		}
	}
	// A rollout replaces one edge at a time, a new one ready first.
	if r := d.Spec.Strategy.RollingUpdate; r.MaxUnavailable != 0 || r.MaxSurge != 1 {
		t.Errorf("edge rollout %+v, want maxUnavailable 0, maxSurge 1", r)
	}
	for _, o := range objs["PodDisruptionBudget"] {
		if o.Metadata.Labels["app.kubernetes.io/component"] != "edge" {
			continue
		}
		var p struct {
			Spec struct {
				MaxUnavailable int `yaml:"maxUnavailable"`
				Selector       struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"selector"`
			} `yaml:"spec"`
		}
		o.decode(t, &p)
		if p.Spec.MaxUnavailable != 1 {
			t.Errorf("PDB maxUnavailable %d, want 1", p.Spec.MaxUnavailable)
		}
		checkSelects(t, "edge PDB", p.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels)
	}
}

func checkRouter(t *testing.T, objs map[string][]object) {
	d, c := workload(t, objs, "router")
	checkPod(t, "router", d, c, "/usr/local/bin/hermes-router", 8790)
	if v, _ := c.env("MOBILE_ROUTER_LISTEN"); v != "0.0.0.0:"+strconv.Itoa(c.port("api")) {
		t.Errorf("router MOBILE_ROUTER_LISTEN=%q, port api %d", v, c.port("api"))
	}
}

// checkPod checks what edges and routers share: the command, the admin
// port and its probes, security, resources, the variables.
func checkPod(t *testing.T, service string, d podTemplate, c container, command string, adminPort int) {
	if !slices.Equal(c.Command, []string{command}) {
		t.Errorf("%s command %v, want %s", service, c.Command, command)
	}
	if c.port("admin") != adminPort {
		t.Errorf("%s admin port %d, want %d", service, c.port("admin"), adminPort)
	}
	if v, _ := c.env("MOBILE_ADMIN_LISTEN"); v != "0.0.0.0:"+strconv.Itoa(adminPort) {
		t.Errorf("%s MOBILE_ADMIN_LISTEN=%q, want 0.0.0.0:%d", service, v, adminPort)
	}
	for name, p := range map[string]struct {
		probe *probeSpec
		path  string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s has no HTTP %s probe", service, name)
		} else if get := *p.probe.HTTPGet; get.Path != p.path || get.Port != "admin" {
			t.Errorf("%s %s probe GET %s on port %s, want GET %s on port admin", service, name, get.Path, get.Port, p.path)
		}
	}
	sc := c.SecurityContext
	if !d.Spec.Template.Spec.SecurityContext.RunAsNonRoot || !sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("%s security: runAsNonRoot %v, container %+v: want non-root, read-only root, no escalation, drop ALL",
			service, d.Spec.Template.Spec.SecurityContext.RunAsNonRoot, sc)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
		t.Errorf("%s resources.requests %v: want cpu and memory", service, c.Resources.Requests)
	}
	if d.Spec.Template.Metadata.Annotations["checksum/config"] == "" {
		t.Errorf("%s pods lack the checksum/config annotation", service)
	}
	checkSelects(t, service+" Deployment", d.Spec.Selector.MatchLabels, d.Spec.Template.Metadata.Labels)
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	checkEnv(t, service+" Deployment", service, names)
}

// checkSecretRefs checks which Secret the tokens come from: the user's
// (with no Secret rendered) or the chart's, whose keys are then the
// variables' names.
func checkSecretRefs(t *testing.T, objs map[string][]object, existing string) {
	var refs int
	for _, component := range []string{"edge", "router"} {
		d, c := workload(t, objs, component)
		_, hasSum := d.Spec.Template.Metadata.Annotations["checksum/secret"]
		if hasSum == (existing != "") {
			t.Errorf("%s checksum/secret annotation present %v with existingSecret %q", component, hasSum, existing)
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Name == "REDIS_URL" {
				continue
			}
			refs++
			ref := e.ValueFrom.SecretKeyRef
			want := existing
			if want == "" {
				want = "hermes-hermes-gateway-auth"
			}
			if ref.Name != want {
				t.Errorf("%s %s comes from Secret %q, want %q", component, e.Name, ref.Name, want)
			}
			if existing == "" && ref.Key != e.Name {
				t.Errorf("%s %s comes from key %q of the chart's Secret, want %s", component, e.Name, ref.Key, e.Name)
			}
		}
	}
	if refs < 3 {
		t.Errorf("%d tokens from a Secret, want MOBILE_TOKEN on the edge and the deliver and agent tokens", refs)
	}
	for _, s := range objs["Secret"] {
		accepted := acceptedEnv(t)
		for _, k := range keys(s.Data) {
			if !accepted["edge"][k] && !accepted["router"][k] {
				t.Errorf("the chart's Secret has %s, which neither service accepts", k)
			}
		}
		if _, ok := s.Data["MOBILE_TOKEN"]; !ok {
			t.Errorf("the chart's Secret has no MOBILE_TOKEN (keys %v)", keys(s.Data))
		}
	}
}

func checkServiceMonitor(t *testing.T, objs map[string][]object) {
	var sm struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Endpoints []struct{ Port, Path string } `yaml:"endpoints"`
		} `yaml:"spec"`
	}
	objs["ServiceMonitor"][0].decode(t, &sm)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v: want /metrics on port admin", sm.Spec.Endpoints)
	}
	selected := map[string]bool{}
	for _, s := range objs["Service"] {
		if matches(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
			selected[s.Metadata.Labels["app.kubernetes.io/component"]] = true
		}
	}
	if !selected["edge"] || !selected["router"] {
		t.Errorf("the ServiceMonitor selects the Services of %v, want edge and router", keys(selected))
	}
}

func checkSelects(t *testing.T, what string, selector, labels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !matches(selector, labels) {
		t.Errorf("%s selector %v does not select pods labelled %v", what, selector, labels)
	}
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func mustYAML(v any) string {
	b, _ := yaml.Marshal(v)
	return strings.TrimSpace(string(b))
}
