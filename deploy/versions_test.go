package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// natsModuleVersion is the version of github.com/nats-io/nats-server/v2 in
// go.mod: the NATS server the gateway embeds and CI builds for the tests.
func natsModuleVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\d+\.\d+\.\d+)\s`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod requires no github.com/nats-io/nats-server/v2")
	}
	return string(m[1])
}

// natsTag matches an official NATS image: nats:2.15-alpine, nats:2.15.3-alpine,
// optionally pinned by digest.
var natsTag = regexp.MustCompile(`^nats:(\d+\.\d+)(\.\d+)?-alpine(@sha256:[0-9a-f]{64})?$`)

// TestChartServerVersions: the servers that ship are the servers tested.
// The NATS image of docker-compose.yml and of the chart's bundled pod is
// the minor release of the nats-server go.mod embeds (CI builds that version
// for the tests), and a patch release in the tag is that one; compose and
// the chart run the same Redis-protocol image; both hand the Redis image
// options only, so that a Valkey or a Redis image each starts its own
// server, and probe it with redis-cli (which both have); docs/operations.md
// names the NATS version CI runs and both default images.
func TestChartServerVersions(t *testing.T) {
	want := natsModuleVersion(t)
	minor := want[:strings.LastIndex(want, ".")]

	c := loadCompose(t)
	composeImage := func(name string) string {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no %s service", name)
		}
		return interpolate(s.Image)
	}
	ms := renderStrict(t, "hermes", "--set", "auth.token="+testToken)
	chartNATS := deployment(t, ms, "nats").Spec.Template.Spec.Containers[0]
	chartRedis := deployment(t, ms, "redis").Spec.Template.Spec.Containers[0]

	for where, image := range map[string]string{"docker-compose.yml nats": composeImage("nats"), "the chart's nats.image": chartNATS.Image} {
		m := natsTag.FindStringSubmatch(image)
		switch {
		case m == nil:
			t.Errorf("%s: %q is not nats:<minor>[.<patch>]-alpine", where, image)
		case m[1] != minor:
			t.Errorf("%s: %q runs NATS %s, but the gateway embeds and CI tests %s (go.mod)", where, image, m[1], want)
		case m[2] != "" && m[1]+m[2] != want:
			t.Errorf("%s: %q runs NATS %s%s, but the gateway embeds and CI tests %s (go.mod)", where, image, m[1], m[2], want)
		}
	}

	redisImage := composeImage("redis")
	if chartRedis.Image != redisImage {
		t.Errorf("the chart's redis.image %q and docker-compose.yml's %q differ: ship one Redis-protocol server", chartRedis.Image, redisImage)
	}
	if cmd := c.Services["redis"].Command; len(cmd) == 0 || !strings.HasPrefix(cmd[0], "-") {
		t.Errorf("docker-compose.yml redis command %q: want options only, so the image's entrypoint starts its own server (valkey-server or redis-server)", cmd)
	}
	if len(chartRedis.Command) != 0 || len(chartRedis.Args) == 0 || !strings.HasPrefix(chartRedis.Args[0], "-") {
		t.Errorf("the chart's redis container command %q args %q: want options only in args, so the image's entrypoint starts its own server", chartRedis.Command, chartRedis.Args)
	}
	if p := chartRedis.ReadinessProbe; p == nil || p.Exec == nil || strings.Join(p.Exec.Command, " ") != "redis-cli ping" {
		t.Errorf("the chart's redis readiness probe %+v: want redis-cli ping (in Redis and Valkey images alike)", p)
	}
	if hc := c.Services["redis"].Healthcheck.Test; strings.Join(hc, " ") != "CMD redis-cli ping" {
		t.Errorf("docker-compose.yml redis healthcheck %q: want CMD redis-cli ping", hc)
	}

	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "### Supported servers")
	if i < 0 {
		t.Fatal(`docs/operations.md has no "### Supported servers"`)
	}
	section := doc[i+1:]
	if j := strings.Index(section, "\n#"); j >= 0 {
		section = section[:j]
	}
	for _, w := range []string{want, "`" + redisImage + "`", "`" + composeImage("nats") + "`"} {
		if !strings.Contains(section, w) {
			t.Errorf("docs/operations.md, Supported servers: does not name %s", w)
		}
	}
}
