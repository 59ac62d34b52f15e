package deploy

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// testToken is the app token the renders below pass as auth.token.
const testToken = "test-token-0123456789"

// manifest is one rendered document, strictly decoded into its Kubernetes
// API type (or, for the operator CRDs the chart may render, into the
// subset of their schema the chart uses).
type manifest struct {
	Kind string
	Name string
	Raw  []byte
	Obj  any
}

// kinds maps each kind the chart may render to its apiVersion and a new
// value of its Go type.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"ConfigMap":               {"v1", func() any { return new(corev1.ConfigMap) }},
	"Secret":                  {"v1", func() any { return new(corev1.Secret) }},
	"Service":                 {"v1", func() any { return new(corev1.Service) }},
	"ServiceAccount":          {"v1", func() any { return new(corev1.ServiceAccount) }},
	"Pod":                     {"v1", func() any { return new(corev1.Pod) }},
	"Deployment":              {"apps/v1", func() any { return new(appsv1.Deployment) }},
	"HorizontalPodAutoscaler": {"autoscaling/v2", func() any { return new(autoscalingv2.HorizontalPodAutoscaler) }},
	"PodDisruptionBudget":     {"policy/v1", func() any { return new(policyv1.PodDisruptionBudget) }},
	"Ingress":                 {"networking.k8s.io/v1", func() any { return new(networkingv1.Ingress) }},
	"NetworkPolicy":           {"networking.k8s.io/v1", func() any { return new(networkingv1.NetworkPolicy) }},
	"ServiceMonitor":          {"monitoring.coreos.com/v1", func() any { return new(serviceMonitor) }},
	"HTTPRoute":               {"gateway.networking.k8s.io/v1", func() any { return new(httpRoute) }},
	"PrometheusRule":          {"monitoring.coreos.com/v1", func() any { return new(prometheusRule) }},
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart renders; strict decoding rejects any field outside it.
type serviceMonitor struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   objectMetaRaw `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port              string          `json:"port"`
			Path              string          `json:"path"`
			Interval          string          `json:"interval"`
			ScrapeTimeout     string          `json:"scrapeTimeout,omitempty"`
			Relabelings       []relabelConfig `json:"relabelings,omitempty"`
			MetricRelabelings []relabelConfig `json:"metricRelabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// relabelConfig is monitoring.coreos.com/v1 RelabelConfig.
type relabelConfig struct {
	Action       string   `json:"action,omitempty"`
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
}

// httpRoute is the part of gateway.networking.k8s.io/v1 HTTPRoute the chart
// renders.
type httpRoute struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   objectMetaRaw `json:"metadata"`
	Spec       struct {
		ParentRefs []struct {
			Group       *string `json:"group,omitempty"`
			Kind        *string `json:"kind,omitempty"`
			Namespace   *string `json:"namespace,omitempty"`
			Name        string  `json:"name"`
			SectionName *string `json:"sectionName,omitempty"`
			Port        *int32  `json:"port,omitempty"`
		} `json:"parentRefs"`
		Hostnames []string `json:"hostnames,omitempty"`
		Rules     []struct {
			Matches []struct {
				Path struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path"`
			} `json:"matches"`
			BackendRefs []struct {
				Name string `json:"name"`
				Port int32  `json:"port"`
			} `json:"backendRefs"`
			Timeouts *struct {
				Request        string `json:"request,omitempty"`
				BackendRequest string `json:"backendRequest,omitempty"`
			} `json:"timeouts,omitempty"`
		} `json:"rules"`
	} `json:"spec"`
}

// prometheusRule is the part of monitoring.coreos.com/v1 PrometheusRule the
// chart renders.
type prometheusRule struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   objectMetaRaw `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type objectMetaRaw struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// renderStrict runs helm template (release name release) and decodes every
// document strictly into its Go type: an unknown or misspelt field, a
// wrong type, a duplicate key or an unknown kind fails the test.
func renderStrict(t *testing.T, release string, args ...string) []manifest {
	t.Helper()
	out, err := helmTemplate(t, release, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	var ms []manifest
	for _, doc := range docSep.Split(string(out), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("helm template %v: %v\n%s", args, err, doc)
		}
		if head.Kind == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				t.Errorf("a document without a kind:\n%s", doc)
			}
			continue
		}
		k, ok := kinds[head.Kind]
		if !ok {
			t.Errorf("%s %s: a kind this test does not know; add its Go type", head.Kind, head.Metadata.Name)
			continue
		}
		if head.APIVersion != k.apiVersion {
			t.Errorf("%s %s: apiVersion %s, want %s", head.Kind, head.Metadata.Name, head.APIVersion, k.apiVersion)
		}
		obj := k.new()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s %s does not decode strictly into its Kubernetes type: %v", head.Kind, head.Metadata.Name, err)
			continue
		}
		ms = append(ms, manifest{Kind: head.Kind, Name: head.Metadata.Name, Raw: []byte(doc), Obj: obj})
	}
	return ms
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func helmTemplate(t *testing.T, release string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", release, chart, "--namespace", "gw", "--kube-version", kubeVersion}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, stderr.String())
	}
	return out, nil
}

// all returns the manifests of type T.
func all[T any](ms []manifest) []*T {
	var out []*T
	for _, m := range ms {
		if o, ok := m.Obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

func deployment(t *testing.T, ms []manifest, component string) *appsv1.Deployment {
	t.Helper()
	for _, d := range all[appsv1.Deployment](ms) {
		if d.Labels["app.kubernetes.io/component"] == component {
			return d
		}
	}
	t.Fatalf("no %s Deployment", component)
	return nil
}

func containerEnv(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// chartCases are the renders every strict check runs on.
func chartCases() []struct {
	name, release string
	args          []string
} {
	prod := filepath.Join(chart, "values-production.yaml")
	return []struct {
		name, release string
		args          []string
	}{
		{"default", "hermes", []string{"--set", "auth.token=" + testToken}},
		{"production", "hermes", []string{"-f", prod}},
		{"existing secret", "hermes", []string{"--set", "auth.existingSecret=my-tokens", "--set", "auth.existingSecretKeys.deliverTokens=DELIVER"}},
		{"everything", "hermes", append([]string{"-f", prod,
			"--set", "router.service.type=LoadBalancer", "--set", "router.service.loadBalancerSourceRanges={10.0.0.0/8}",
			"--set", "router.service.annotations.a=b", "--set", "edge.service.loadBalancerSourceRanges={0.0.0.0/0}"}, everythingArgs...)},
		{"everything bundled", "hermes", append([]string{"--set", "auth.token=" + testToken}, everythingArgs...)},
		// The longest release name helm accepts (53), with no name already in it.
		{"long release name", strings.Repeat("r", 53), []string{"--set", "auth.token=" + testToken, "--set", "metrics.serviceMonitor.enabled=true"}},
		{"long fullnameOverride", "hermes", []string{"--set", "auth.token=" + testToken, "--set", "fullnameOverride=" + strings.Repeat("f", 45)}},
	}
}

// TestChartStrict renders the chart in every case and decodes each
// document strictly into the Kubernetes API type of its kind, and checks
// the names Kubernetes would reject: every resource name a DNS subdomain,
// Service names DNS labels (63 characters), label values, port names.
func TestChartStrict(t *testing.T) {
	for _, tc := range chartCases() {
		t.Run(tc.name, func(t *testing.T) {
			ms := renderStrict(t, tc.release, tc.args...)
			if len(ms) < 6 {
				t.Fatalf("%d manifests rendered", len(ms))
			}
			for _, m := range ms {
				check := validation.IsDNS1123Subdomain
				if m.Kind == "Service" {
					check = validation.IsDNS1035Label
				}
				if errs := check(m.Name); len(errs) > 0 {
					t.Errorf("%s name %q: %v", m.Kind, m.Name, errs)
				}
				if len(m.Name) > 63 {
					t.Errorf("%s name %q is %d characters, over 63", m.Kind, m.Name, len(m.Name))
				}
			}
			for _, d := range all[appsv1.Deployment](ms) {
				for k, v := range d.Spec.Template.Labels {
					if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
						t.Errorf("Deployment %s label %s=%q: %v", d.Name, k, v, errs)
					}
				}
				for _, c := range d.Spec.Template.Spec.Containers {
					for _, p := range c.Ports {
						if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
							t.Errorf("Deployment %s port %q: %v", d.Name, p.Name, errs)
						}
					}
				}
			}
		})
	}
}

// TestChartStrictRejects shows the strict decoding fails on a field the
// Kubernetes type lacks, which a plain YAML decode would ignore.
func TestChartStrictRejects(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  minReadySecond: 10\n")
	if err := yaml.UnmarshalStrict(doc, new(appsv1.Deployment)); err == nil {
		t.Fatal("a misspelt field decoded without error")
	}
}

// TestChartSecretStable: the chart's Secret, and the pods' checksum of it,
// are the same on every render (a GitOps tool renders with helm template
// on each sync: a new token would restart every edge and lock every phone
// out), and it is kept on uninstall. Without auth.token, auth.existingSecret
// or auth.generateToken the chart refuses to render.
func TestChartSecretStable(t *testing.T) {
	args := []string{"--set", "auth.token=" + testToken, "--set", "auth.deliverTokens=d1"}
	a, err := helmTemplate(t, "hermes", args...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := helmTemplate(t, "hermes", args...)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two renders with the same values differ")
	}
	ms := renderStrict(t, "hermes", args...)
	secrets := all[corev1.Secret](ms)
	if len(secrets) != 1 {
		t.Fatalf("%d Secrets, want the chart's one", len(secrets))
	}
	s := secrets[0]
	if got := string(s.Data["MOBILE_TOKEN"]); got != testToken {
		t.Errorf("MOBILE_TOKEN %q, want auth.token", got)
	}
	if s.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("Secret annotations %v: want helm.sh/resource-policy: keep", s.Annotations)
	}

	_, err = helmTemplate(t, "hermes")
	if err == nil || !strings.Contains(err.Error(), "set auth.token") {
		t.Errorf("render without a token: %v, want the chart to ask for auth.token", err)
	}
	// Asked for, a token is generated (helm install reads it back at upgrades).
	ms = renderStrict(t, "hermes", "--set", "auth.generateToken=true")
	if s := all[corev1.Secret](ms); len(s) != 1 || len(s[0].Data["MOBILE_TOKEN"]) != 40 {
		t.Errorf("auth.generateToken: want a Secret with a 40-character MOBILE_TOKEN")
	}
}

// TestChartTokenRefs: no token reference is optional (a missing Secret or
// key keeps the pod from starting instead of starting an edge without its
// token), and every key referenced exists in the chart's Secret, or is one
// auth.existingSecretKeys names.
func TestChartTokenRefs(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		secret   string
		wantVars map[string]string // variable → key, per component "edge:VAR"
		noVars   []string
	}{
		{
			name:     "chart secret, token only",
			args:     []string{"--set", "auth.token=" + testToken},
			secret:   "hermes-hermes-gateway-auth",
			wantVars: map[string]string{"edge:MOBILE_TOKEN": "MOBILE_TOKEN"},
			noVars:   []string{"edge:MOBILE_DELIVER_TOKENS", "router:MOBILE_DELIVER_TOKENS", "router:MOBILE_AGENT_TOKENS", "edge:MOBILE_EXTRA_TOKENS"},
		},
		{
			name:   "chart secret, all tokens",
			args:   []string{"--set", "auth.token=" + testToken, "--set", "auth.deliverTokens=d", "--set", "auth.agentTokens=a", "--set", "auth.extraTokens=x=y"},
			secret: "hermes-hermes-gateway-auth",
			wantVars: map[string]string{"edge:MOBILE_TOKEN": "MOBILE_TOKEN", "edge:MOBILE_DELIVER_TOKENS": "MOBILE_DELIVER_TOKENS",
				"router:MOBILE_DELIVER_TOKENS": "MOBILE_DELIVER_TOKENS", "router:MOBILE_AGENT_TOKENS": "MOBILE_AGENT_TOKENS", "edge:MOBILE_EXTRA_TOKENS": "MOBILE_EXTRA_TOKENS"},
		},
		{
			name:     "existing secret, named keys",
			args:     []string{"--set", "auth.existingSecret=mine", "--set", "auth.existingSecretKeys.token=app", "--set", "auth.existingSecretKeys.agentTokens=agent"},
			secret:   "mine",
			wantVars: map[string]string{"edge:MOBILE_TOKEN": "app", "router:MOBILE_AGENT_TOKENS": "agent"},
			noVars:   []string{"edge:MOBILE_DELIVER_TOKENS", "router:MOBILE_DELIVER_TOKENS", "edge:MOBILE_EXTRA_TOKENS"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ms := renderStrict(t, "hermes", tc.args...)
			var secretKeys map[string][]byte
			if s := all[corev1.Secret](ms); len(s) == 1 {
				secretKeys = s[0].Data
			}
			for _, d := range all[appsv1.Deployment](ms) {
				for _, c := range d.Spec.Template.Spec.Containers {
					for _, e := range c.Env {
						if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
							continue
						}
						ref := e.ValueFrom.SecretKeyRef
						if ref.Optional != nil && *ref.Optional {
							t.Errorf("%s %s: the Secret reference is optional", d.Name, e.Name)
						}
						if e.Name == "REDIS_URL" {
							continue
						}
						if ref.Name != tc.secret {
							t.Errorf("%s %s from Secret %q, want %q", d.Name, e.Name, ref.Name, tc.secret)
						}
						if secretKeys != nil {
							if _, ok := secretKeys[ref.Key]; !ok {
								t.Errorf("%s %s from key %s, which the chart's Secret lacks", d.Name, e.Name, ref.Key)
							}
						}
					}
				}
			}
			for v, key := range tc.wantVars {
				component, name, _ := strings.Cut(v, ":")
				e := containerEnv(deployment(t, ms, component).Spec.Template.Spec.Containers[0], name)
				if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != key {
					t.Errorf("%s %s: %+v, want key %s of the Secret", component, name, e, key)
				}
			}
			for _, v := range tc.noVars {
				component, name, _ := strings.Cut(v, ":")
				if e := containerEnv(deployment(t, ms, component).Spec.Template.Spec.Containers[0], name); e != nil {
					t.Errorf("%s sets %s, which has no value", component, name)
				}
			}
		})
	}
}

// TestChartAdminServices: the admin ports (/metrics) are only on ClusterIP
// Services of their own, so a LoadBalancer for the API or the edges never
// publishes them; the router Service takes annotations and
// loadBalancerSourceRanges.
func TestChartAdminServices(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken,
		"--set", "router.service.type=LoadBalancer", "--set", "edge.service.type=LoadBalancer",
		"--set", "router.service.loadBalancerSourceRanges={10.0.0.0/8,192.168.0.0/16}",
		"--set", "router.service.annotations.service\\.beta\\.kubernetes\\.io/aws-load-balancer-internal=true",
		"--set", "edge.service.loadBalancerSourceRanges={203.0.113.0/24}")
	admins := map[string]bool{}
	for _, s := range all[corev1.Service](ms) {
		var admin, other int
		for _, p := range s.Spec.Ports {
			if p.TargetPort.String() == "admin" {
				admin++
			} else {
				other++
			}
		}
		if admin > 0 && (other > 0 || s.Spec.Type != corev1.ServiceTypeClusterIP) {
			t.Errorf("Service %s (%s) has the admin port beside %d other ports", s.Name, s.Spec.Type, other)
		}
		if admin > 0 {
			admins[s.Labels["app.kubernetes.io/component"]] = true
		}
		switch s.Name {
		case "hermes-hermes-gateway-router":
			if s.Spec.Type != corev1.ServiceTypeLoadBalancer || strings.Join(s.Spec.LoadBalancerSourceRanges, ",") != "10.0.0.0/8,192.168.0.0/16" ||
				s.Annotations["service.beta.kubernetes.io/aws-load-balancer-internal"] != "true" {
				t.Errorf("router Service %s, ranges %v, annotations %v", s.Spec.Type, s.Spec.LoadBalancerSourceRanges, s.Annotations)
			}
		case "hermes-hermes-gateway-edge":
			if strings.Join(s.Spec.LoadBalancerSourceRanges, ",") != "203.0.113.0/24" {
				t.Errorf("edge Service ranges %v", s.Spec.LoadBalancerSourceRanges)
			}
		}
	}
	if !admins["edge"] || !admins["router"] {
		t.Errorf("admin Services for %v, want edge and router", admins)
	}
}

// TestChartSchema: values.schema.json rejects values that would render a
// broken release, at the boundary: the smallest valid value passes, one
// less fails naming the value.
func TestChartSchema(t *testing.T) {
	tok := []string{"--set", "auth.token=" + testToken}
	ok := [][]string{
		{"--set", "edge.preStopSleepSeconds=1"},
		{"--set", "edge.drainWindowSeconds=1"},
		{"--set", "edge.terminationMarginSeconds=15"},
		{"--set", "router.terminationMarginSeconds=15", "--set", "router.preStopSleepSeconds=1"},
		{"--set", "fullnameOverride=" + strings.Repeat("f", 45)},
		{"--set", "edge.resources.limits.memory=1536Mi"},
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
		{[]string{"--set", "edge.preStopSleepSeconds=0"}, "/edge/preStopSleepSeconds"},
		{[]string{"--set", "edge.drainWindowSeconds=0"}, "/edge/drainWindowSeconds"},
		{[]string{"--set", "edge.terminationMarginSeconds=14"}, "/edge/terminationMarginSeconds"},
		{[]string{"--set", "router.preStopSleepSeconds=0"}, "/router/preStopSleepSeconds"},
		{[]string{"--set", "router.terminationMarginSeconds=14"}, "/router/terminationMarginSeconds"},
		{[]string{"--set", "edge.drainWindowSeconds=ten"}, "/edge/drainWindowSeconds"},
		{[]string{"--set", "edge.replicas=0", "--set", "edge.autoscaling.enabled=false"}, "/edge/replicas"},
		{[]string{"--set", "edge.drainWindow=10"}, "drainWindow"},
		{[]string{"--set", "edeg.replicas=2"}, "edeg"},
		{[]string{"--set", "router.agent=gpt"}, "/router/agent"},
		{[]string{"--set", "config.logLevel=verbose"}, "/config/logLevel"},
		{[]string{"--set", "edge.service.type=External"}, "/edge/service/type"},
		{[]string{"--set", "edge.service.port=0"}, "/edge/service/port"},
		{[]string{"--set", "fullnameOverride=" + strings.Repeat("f", 46)}, "/fullnameOverride"},
		{[]string{"--set", "edge.resources.limits.memory=1.5Gi"}, "/edge/resources/limits/memory"},
		{[]string{"--set", "auth.existingSecret=x", "--set", "auth.existingSecretKeys.token="}, "/auth/existingSecretKeys/token"},
	}
	for _, tc := range bad {
		_, err := helmTemplate(t, "hermes", append(tok, tc.args...)...)
		if err == nil {
			t.Errorf("%v rendered, want a schema error", tc.args)
		} else if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a schema error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestChartRollout checks how pods are replaced and sized, in the default
// and the production values: minReadySeconds, router preStop and grace
// period, the router PDB, memory request = limit with GOMEMLIMIT at 90 % of
// it, and spread constraints that count only this release's pods.
func TestChartRollout(t *testing.T) {
	for _, tc := range chartCases()[:2] {
		t.Run(tc.name, func(t *testing.T) {
			ms := renderStrict(t, tc.release, tc.args...)
			files := []string{"values.yaml"}
			if tc.name == "production" {
				files = append(files, "values-production.yaml")
			}
			vals := values(t, files...)
			edge := deployment(t, ms, "edge")
			if want := int32(intValue(t, vals, "edge", "minReadySeconds")); edge.Spec.MinReadySeconds != want || want < 1 {
				t.Errorf("edge minReadySeconds %d, want edge.minReadySeconds %d (> 0)", edge.Spec.MinReadySeconds, want)
			}
			if tc.name == "production" {
				// A cloud load balancer takes 2-3 failed health checks of
				// 10 s to stop sending to a backend.
				if p := intValue(t, vals, "edge", "preStopSleepSeconds"); p < 30 {
					t.Errorf("production edge preStop %d s: a cloud load balancer still sends phones for up to 30 s", p)
				}
			}

			router := deployment(t, ms, "router")
			rc := router.Spec.Template.Spec.Containers[0]
			preStop := intValue(t, vals, "router", "preStopSleepSeconds")
			if l := rc.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || int(l.PreStop.Sleep.Seconds) != preStop {
				t.Errorf("router preStop %+v, want a sleep of router.preStopSleepSeconds %d", l, preStop)
			}
			grace := router.Spec.Template.Spec.TerminationGracePeriodSeconds
			if want := int64(preStop + intValue(t, vals, "router", "terminationMarginSeconds")); grace == nil || *grace != want {
				t.Errorf("router terminationGracePeriodSeconds %v, want preStop + margin %d", grace, want)
			}
			var routerPDB bool
			for _, p := range all[policyv1.PodDisruptionBudget](ms) {
				if p.Spec.Selector != nil && matches(p.Spec.Selector.MatchLabels, router.Spec.Template.Labels) {
					routerPDB = true
					if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
						t.Errorf("router PDB maxUnavailable %v, want 1", p.Spec.MaxUnavailable)
					}
				}
			}
			if !routerPDB {
				t.Error("no PodDisruptionBudget selects the routers")
			}

			for _, d := range []*appsv1.Deployment{edge, router} {
				c := d.Spec.Template.Spec.Containers[0]
				limit, req := c.Resources.Limits.Memory(), c.Resources.Requests.Memory()
				if limit.IsZero() || !limit.Equal(*req) {
					t.Errorf("%s memory request %s, limit %s: want equal", d.Name, req, limit)
				}
				e := containerEnv(c, "GOMEMLIMIT")
				if want := fmt.Sprint(limit.Value() * 9 / 10); e == nil || e.Value != want {
					t.Errorf("%s GOMEMLIMIT %+v, want %s (90 %% of the limit %s)", d.Name, e, want, limit)
				}
				if len(d.Spec.Template.Spec.TopologySpreadConstraints) == 0 {
					t.Errorf("%s has no topologySpreadConstraints", d.Name)
				}
				for _, sc := range d.Spec.Template.Spec.TopologySpreadConstraints {
					if sc.LabelSelector == nil || sc.LabelSelector.MatchLabels["app.kubernetes.io/instance"] != "hermes" ||
						sc.LabelSelector.MatchLabels["app.kubernetes.io/component"] != d.Labels["app.kubernetes.io/component"] ||
						!matches(sc.LabelSelector.MatchLabels, d.Spec.Template.Labels) {
						t.Errorf("%s spread on %s selects %v: want this release's %s pods", d.Name, sc.TopologyKey, sc.LabelSelector, d.Labels["app.kubernetes.io/component"])
					}
					if !slices.Contains(sc.MatchLabelKeys, "pod-template-hash") {
						t.Errorf("%s spread on %s: matchLabelKeys %v, want pod-template-hash", d.Name, sc.TopologyKey, sc.MatchLabelKeys)
					}
				}
			}
		})
	}
}

// TestChartMemoryLimit checks GOMEMLIMIT for each unit a memory limit may use.
func TestChartMemoryLimit(t *testing.T) {
	for limit, want := range map[string]string{"1536Mi": "1449551462", "2G": "1800000000", "1073741824": "966367641", "4Gi": "3865470566"} {
		ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "edge.resources.limits.memory="+limit)
		c := deployment(t, ms, "edge").Spec.Template.Spec.Containers[0]
		if e := containerEnv(c, "GOMEMLIMIT"); e == nil || e.Value != want {
			t.Errorf("limit %s: GOMEMLIMIT %+v, want %s", limit, e, want)
		}
	}
}

// TestChartGOMAXPROCS: each service's GOMAXPROCS is its CPU request in
// whole cores, from the downward API (the pods set no CPU limit, so the Go
// runtime's own default would be the node's cores).
func TestChartGOMAXPROCS(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken)
	for _, service := range []string{"edge", "router"} {
		c := deployment(t, ms, service).Spec.Template.Spec.Containers[0]
		e := containerEnv(c, "GOMAXPROCS")
		if e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil {
			t.Errorf("%s GOMAXPROCS %+v, want it from the downward API", service, e)
			continue
		}
		if ref := e.ValueFrom.ResourceFieldRef; ref.Resource != "requests.cpu" || ref.Divisor.String() != "1" {
			t.Errorf("%s GOMAXPROCS from %s with divisor %s, want requests.cpu with divisor 1", service, ref.Resource, ref.Divisor.String())
		}
	}
}

// everythingArgs turn on every optional piece of the chart.
var everythingArgs = []string{
	"--set", "ingress.enabled=true", "--set", "ingress.className=nginx", "--set", "ingress.host=gw.example.com",
	"--set", "ingress.tls[0].secretName=gw-tls", "--set", "ingress.tls[0].hosts[0]=gw.example.com",
	"--set", "httpRoute.enabled=true", "--set", "httpRoute.parentRefs[0].name=public", "--set", "httpRoute.parentRefs[0].namespace=gateways",
	"--set", "httpRoute.hostnames[0]=gw.example.com",
	"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
	"--set", "networkPolicy.wsFrom[0].namespaceSelector.matchLabels.name=ingress",
	"--set", "metrics.serviceMonitor.enabled=true", "--set", "edge.autoscaling.targetConnectionsPerPod=20000",
	"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.grafanaDashboard.enabled=true",
	"--set", "serviceAccount.annotations.role=r",
	"--set", "edge.podLabels.team=mobile", "--set", "router.podLabels.team=mobile",
	"--set", "edge.priorityClassName=high", "--set", "router.priorityClassName=high",
	"--set", "edge.extraVolumes[0].name=certs", "--set", "edge.extraVolumes[0].emptyDir.medium=Memory",
	"--set", "edge.extraVolumeMounts[0].name=certs", "--set", "edge.extraVolumeMounts[0].mountPath=/certs",
	"--set", "edge.extraContainers[0].name=shipper", "--set", "edge.extraContainers[0].image=busybox",
	"--set", "router.extraContainers[0].name=shipper", "--set", "router.extraContainers[0].image=busybox",
	"--set", "edge.probes.liveness.tcpSocket.port=ws", "--set", "edge.probes.liveness.periodSeconds=20",
	"--set", "router.probes.readiness.httpGet.path=/healthz", "--set", "router.probes.readiness.httpGet.port=admin",
}

// TestChartConventions renders every optional piece and checks what
// operators expect of a chart: appProtocol on Service ports, a
// ServiceAccount without a mounted token, revisionHistoryLimit, podLabels
// outside the selector, priorityClassName, extra volumes and containers,
// probes replaced whole, an Ingress and an HTTPRoute to the edges' ws port
// with WebSocket timeouts, NetworkPolicies, and the helm test pod.
func TestChartConventions(t *testing.T) {
	ms := renderStrict(t, "hermes", append([]string{"--set", "auth.token=" + testToken}, everythingArgs...)...)
	services := map[string]*corev1.Service{}
	for _, s := range all[corev1.Service](ms) {
		services[s.Name] = s
	}
	wantProto := map[string]string{"hermes-hermes-gateway-edge": "kubernetes.io/ws", "hermes-hermes-gateway-edge-admin": "http",
		"hermes-hermes-gateway-router": "http", "hermes-hermes-gateway-router-admin": "http"}
	for name, proto := range wantProto {
		s := services[name]
		if s == nil {
			t.Errorf("no Service %s", name)
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.AppProtocol == nil || *p.AppProtocol != proto {
				t.Errorf("Service %s port %s appProtocol %v, want %s", name, p.Name, p.AppProtocol, proto)
			}
		}
	}

	sas := all[corev1.ServiceAccount](ms)
	if len(sas) != 1 || sas[0].AutomountServiceAccountToken == nil || *sas[0].AutomountServiceAccountToken || sas[0].Annotations["role"] != "r" {
		t.Fatalf("ServiceAccounts %+v: want one, annotated, no token mounted", sas)
	}
	for _, component := range []string{"edge", "router"} {
		d := deployment(t, ms, component)
		pod := d.Spec.Template
		if pod.Spec.ServiceAccountName != sas[0].Name {
			t.Errorf("%s serviceAccountName %q, want %s", component, pod.Spec.ServiceAccountName, sas[0].Name)
		}
		if d.Spec.RevisionHistoryLimit == nil || *d.Spec.RevisionHistoryLimit != 5 {
			t.Errorf("%s revisionHistoryLimit %v, want 5", component, d.Spec.RevisionHistoryLimit)
		}
		if pod.Labels["team"] != "mobile" || d.Spec.Selector.MatchLabels["team"] != "" {
			t.Errorf("%s podLabels: pod %v, selector %v: want team on the pods only", component, pod.Labels, d.Spec.Selector.MatchLabels)
		}
		if pod.Spec.PriorityClassName != "high" {
			t.Errorf("%s priorityClassName %q", component, pod.Spec.PriorityClassName)
		}
		if n := len(pod.Spec.Containers); n != 2 || pod.Spec.Containers[1].Name != "shipper" {
			t.Errorf("%s has %d containers, want %s and the extra one", component, n, component)
		}
	}
	edge := deployment(t, ms, "edge").Spec.Template.Spec
	if len(edge.Volumes) != 1 || edge.Volumes[0].EmptyDir == nil || len(edge.Containers[0].VolumeMounts) != 1 || edge.Containers[0].VolumeMounts[0].MountPath != "/certs" {
		t.Errorf("edge volumes %+v, mounts %+v: want the extra volume mounted on /certs", edge.Volumes, edge.Containers[0].VolumeMounts)
	}
	if lp := edge.Containers[0].LivenessProbe; lp == nil || lp.TCPSocket == nil || lp.HTTPGet != nil || lp.PeriodSeconds != 20 {
		t.Errorf("edge liveness probe %+v: want edge.probes.liveness in place of the chart's", lp)
	}
	if rp := edge.Containers[0].ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" {
		t.Errorf("edge readiness probe %+v: want the chart's", rp)
	}
	if rp := deployment(t, ms, "router").Spec.Template.Spec.Containers[0].ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/healthz" || rp.PeriodSeconds != 0 {
		t.Errorf("router readiness probe %+v: want router.probes.readiness whole", rp)
	}

	edgeSvc := services["hermes-hermes-gateway-edge"]
	ings := all[networkingv1.Ingress](ms)
	if len(ings) != 1 {
		t.Fatalf("%d Ingresses, want 1", len(ings))
	}
	ing := ings[0]
	if ing.Annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] != "3600" || ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" || len(ing.Spec.TLS) != 1 {
		t.Errorf("Ingress %+v: want class nginx, TLS, a one-hour read timeout", ing)
	}
	if r := ing.Spec.Rules; len(r) != 1 || r[0].Host != "gw.example.com" || len(r[0].HTTP.Paths) != 1 ||
		r[0].HTTP.Paths[0].Path != "/ws" || r[0].HTTP.Paths[0].Backend.Service.Name != edgeSvc.Name || r[0].HTTP.Paths[0].Backend.Service.Port.Name != "ws" {
		t.Errorf("Ingress rules %+v: want /ws on gw.example.com to the edge Service's ws port", r)
	}
	routes := all[httpRoute](ms)
	if len(routes) != 1 {
		t.Fatalf("%d HTTPRoutes, want 1", len(routes))
	}
	rt := routes[0].Spec
	if len(rt.ParentRefs) != 1 || rt.ParentRefs[0].Name != "public" || len(rt.Rules) != 1 || len(rt.Rules[0].BackendRefs) != 1 ||
		rt.Rules[0].BackendRefs[0].Name != edgeSvc.Name || rt.Rules[0].BackendRefs[0].Port != edgeSvc.Spec.Ports[0].Port ||
		rt.Rules[0].Matches[0].Path.Value != "/ws" || rt.Rules[0].Timeouts == nil || rt.Rules[0].Timeouts.Request != "0s" {
		t.Errorf("HTTPRoute %+v: want /ws to the edge Service's port, request timeout off", rt)
	}
	if _, err := helmTemplate(t, "hermes", "--set", "auth.token="+testToken, "--set", "httpRoute.enabled=true"); err == nil || !strings.Contains(err.Error(), "httpRoute.parentRefs") {
		t.Errorf("an HTTPRoute without parentRefs: %v, want the chart to ask for them", err)
	}

	pols := map[string]*networkingv1.NetworkPolicy{}
	for _, p := range all[networkingv1.NetworkPolicy](ms) {
		pols[p.Labels["app.kubernetes.io/component"]] = p
	}
	for _, component := range []string{"edge", "router", "redis", "nats"} {
		p := pols[component]
		if p == nil {
			t.Errorf("no NetworkPolicy for %s", component)
			continue
		}
		d := deployment(t, ms, component)
		if !matches(p.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) || p.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != component {
			t.Errorf("%s NetworkPolicy selects %v", component, p.Spec.PodSelector.MatchLabels)
		}
		for _, rule := range p.Spec.Ingress {
			if component == "redis" || component == "nats" {
				// Only this release's edges and routers.
				if len(rule.From) != 2 {
					t.Errorf("%s NetworkPolicy lets in %+v, want this release's edges and routers", component, rule.From)
				}
				for _, f := range rule.From {
					if f.PodSelector == nil || f.NamespaceSelector != nil || f.PodSelector.MatchLabels["app.kubernetes.io/instance"] != "hermes" {
						t.Errorf("%s NetworkPolicy peer %+v: want pods of this release", component, f)
					}
				}
			}
			if len(rule.Ports) == 1 && rule.Ports[0].Port.String() == "admin" {
				// The helm test pod reaches the admin ports.
				var test bool
				for _, f := range rule.From {
					test = test || (f.PodSelector != nil && f.PodSelector.MatchLabels["app.kubernetes.io/component"] == "test")
				}
				if !test || len(rule.From) != 2 {
					t.Errorf("%s admin port lets in %+v: want metricsFrom and the test pod", component, rule.From)
				}
			}
		}
	}

	pods := all[corev1.Pod](ms)
	if len(pods) != 1 || pods[0].Annotations["helm.sh/hook"] != "test" || pods[0].Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatalf("test pods %v: want one helm test hook pod", pods)
	}
	if pods[0].Labels["app.kubernetes.io/component"] != "test" {
		t.Errorf("test pod labels %v: the NetworkPolicies let component=test in", pods[0].Labels)
	}
	probed := map[string]bool{}
	for _, c := range pods[0].Spec.Containers {
		if len(c.Command) != 1 || c.Command[0] != "/usr/local/bin/hermes-probe" || len(c.Args) != 1 {
			t.Errorf("test container %s runs %v %v, want hermes-probe URL", c.Name, c.Command, c.Args)
			continue
		}
		for name, s := range services {
			if strings.HasSuffix(name, "-admin") && c.Args[0] == fmt.Sprintf("http://%s:%d/readyz", name, s.Spec.Ports[0].Port) {
				probed[s.Labels["app.kubernetes.io/component"]] = true
			}
		}
	}
	if !probed["edge"] || !probed["router"] {
		t.Errorf("the test pod probes /readyz of %v, want both admin Services", probed)
	}
}

// TestChartHPAConnections: with edge.autoscaling.targetConnectionsPerPod
// the HPA also scales on open WebSockets per edge (a Pods metric), beside CPU.
func TestChartHPAConnections(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken, "--set", "edge.autoscaling.targetConnectionsPerPod=20000")
	hpas := all[autoscalingv2.HorizontalPodAutoscaler](ms)
	if len(hpas) != 1 {
		t.Fatalf("%d HPAs", len(hpas))
	}
	var found bool
	for _, m := range hpas[0].Spec.Metrics {
		if m.Type == autoscalingv2.PodsMetricSourceType && m.Pods != nil && m.Pods.Metric.Name == "hermes_connections" &&
			m.Pods.Target.Type == autoscalingv2.AverageValueMetricType && m.Pods.Target.AverageValue != nil && m.Pods.Target.AverageValue.Value() == 20000 {
			found = true
		}
	}
	if !found {
		t.Errorf("HPA metrics %+v: want hermes_connections averaging 20000 per pod", hpas[0].Spec.Metrics)
	}
	ms = renderStrict(t, "hermes", "--set", "auth.token="+testToken)
	if n := len(all[autoscalingv2.HorizontalPodAutoscaler](ms)[0].Spec.Metrics); n != 1 {
		t.Errorf("default HPA has %d metrics, want CPU only", n)
	}
	if _, err := helmTemplate(t, "hermes", "--set", "auth.token="+testToken, "--set", "edge.autoscaling.targetConnectionsPerPod=0"); err == nil {
		t.Error("targetConnectionsPerPod=0 rendered, want a schema error")
	}
}

// TestChartTenantsFile: with tenants.existingSecret every edge and router
// reads the owners' file from that Secret, mounted as a directory (a
// subPath mount is never updated by the kubelet, so a key added to the
// Secret would wait for a rollout), beside the extra volumes; without it
// no pod names one.
func TestChartTenantsFile(t *testing.T) {
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken,
		"--set", "tenants.existingSecret=owners", "--set", "tenants.key=file.yaml",
		"--set", "edge.extraVolumes[0].name=certs", "--set", "edge.extraVolumes[0].emptyDir.medium=Memory",
		"--set", "edge.extraVolumeMounts[0].name=certs", "--set", "edge.extraVolumeMounts[0].mountPath=/certs")
	for _, component := range []string{"edge", "router"} {
		d := deployment(t, ms, component)
		c := d.Spec.Template.Spec.Containers[0]
		if e := containerEnv(c, "MOBILE_TENANTS_FILE"); e == nil || e.Value != "/etc/hermes/tenants/file.yaml" {
			t.Errorf("%s MOBILE_TENANTS_FILE %+v, want /etc/hermes/tenants/file.yaml", component, e)
		}
		var mounted bool
		for _, m := range c.VolumeMounts {
			if m.Name == "tenants" {
				mounted = m.MountPath == "/etc/hermes/tenants" && m.SubPath == "" && m.ReadOnly
			}
		}
		if !mounted {
			t.Errorf("%s mounts %+v; want tenants read-only at /etc/hermes/tenants, no subPath", component, c.VolumeMounts)
		}
		var fromSecret bool
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == "tenants" && v.Secret != nil {
				fromSecret = v.Secret.SecretName == "owners" && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "file.yaml" && v.Secret.Items[0].Path == "file.yaml"
			}
		}
		if !fromSecret {
			t.Errorf("%s volumes %+v; want tenants from the Secret owners, key file.yaml", component, d.Spec.Template.Spec.Volumes)
		}
		if component == "edge" && len(c.VolumeMounts) != 2 {
			t.Errorf("edge mounts %+v; want the tenants file and the extra volume", c.VolumeMounts)
		}
	}
	for _, d := range all[appsv1.Deployment](renderStrict(t, "hermes", "--set", "auth.token="+testToken)) {
		for _, c := range d.Spec.Template.Spec.Containers {
			if containerEnv(c, "MOBILE_TENANTS_FILE") != nil {
				t.Errorf("%s names a tenants file without tenants.existingSecret", d.Name)
			}
		}
	}
}
