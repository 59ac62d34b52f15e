//go:build unix

package cluster

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// preTenancy is the last commit before owners (docs/tenancy.md): the
// release today's deployments run, and upgrade from.
const preTenancy = "698879e"

// TestRollingUpgradeKeepsQueues: a cluster of the release before owners
// (two edges and a router of preTenancy) has phones asleep with what the
// agent and cron queued for them (cron's with a ttl) and a phone whose
// text the agent answered. Its nodes are replaced one by one with this
// build, each new one up before the old one goes, while more is queued
// through the mix of old and new nodes. Without a tenants file the
// legacy owner's Redis keys keep their names, so nothing is lost: the
// sleeping phones' keys are unchanged by the upgrade, each phone wakes
// to every item in the order queued, and the text sent again is still a
// duplicate the agent does not get. Then the new nodes are replaced
// again by nodes that read a tenants file: the legacy phones still get
// theirs, and an owner of the file connects beside them.
func TestRollingUpgradeKeepsQueues(t *testing.T) {
	t.Parallel()
	oldEdge, oldRouter := buildRelease(t, preTenancy)
	c := newCluster(t, options{edgeBin: oldEdge, routerBin: oldRouter, env: []string{"MOBILE_DRAIN_WINDOW=1"}})

	// On the old release: three phones go to sleep, two with four items
	// each queued by the agent and by cron, the third with one, to which
	// more is queued while the nodes are replaced; and one phone's text
	// is answered.
	first, second, mid := newDevice("tel-up"), newDevice("tel-file"), newDevice("tel-mid")
	texter := newDevice("tel-text")
	cron := c.hello(t, "B", newDevice("cron")) // loopback: may deliver
	queued := make(map[string][]agentMessage)
	for _, dev := range []string{first, second, mid} {
		c.sleep(t, "A", dev)
	}
	for _, dev := range []string{first, second} {
		queued[dev] = c.queue(t, dev, cron)
	}
	queued[mid] = []agentMessage{{ID: "pre", Text: "queued before the upgrade", Final: true}}
	c.say(t, mid, queued[mid][0])
	conn := c.connect(t, "A", texter)
	if err := conn.Text("m-1", "only once"); err != nil {
		t.Fatal(err)
	}
	readUntil(t, conn, "the answer of the old release", finalText("You said: only once"))
	c.hangUp(t, conn, texter)
	cron.CloseNow()
	for _, dev := range []string{first, second} {
		c.wantQueued(t, dev, queued[dev])
	}
	before := c.keysNaming(t, first, second, texter)
	wantKeys(t, before, "outbox:{"+first+"}", "outbox:{"+second+"}", dedupKey(texter, "m-1"))

	// The rolling upgrade: a new edge up, an old one gone; again; then the
	// router. Between the steps the old and the new nodes queue for mid.
	c.startEdge(t, "C")
	c.retireEdge(t, "A")
	c.say(t, mid, note(queued, mid, "mid-1", "said by the old router to new and old edges"))
	c.startEdge(t, "D")
	c.retireEdge(t, "B")
	m := note(queued, mid, "mid-2", "cron through the old router to new edges")
	if code, body := c.post(t, "/v1/deliver", c.deliverToken, map[string]any{"target": protocol.Session(mid), "id": m.ID, "text": m.Text, "ttl": 3600}); code != http.StatusAccepted {
		t.Fatalf("cron's deliver through the old router: %d %v, want 202 queued", code, body)
	}
	c.replaceRouter(t, "router-new", bins.router)
	c.say(t, mid, note(queued, mid, "mid-3", "said by the new router"))

	if after := c.keysNaming(t, first, second, texter); !maps.Equal(before, after) {
		t.Fatalf("the upgrade changed the sleeping phones' keys:\nbefore %v\nafter  %v", before, after)
	}
	c.wake(t, "C", first, queued[first]).CloseNow()
	c.wake(t, "D", mid, queued[mid]).CloseNow()
	c.sendAgain(t, "D", texter, "m-2", "marker")

	// The new nodes again, now with a tenants file: the legacy owner is
	// the file's neighbour and keeps its queue and its dedup keys.
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	writeTenantsFile(t, path, `tenants:
  - id: acme
    keys:
      - {id: app, kind: app, secret: acme-app}
      - {id: cron, kind: deliver, secret: acme-cron}
`)
	withFile := "MOBILE_TENANTS_FILE=" + path
	before = c.keysNaming(t, second, texter)
	wantKeys(t, before, "outbox:{"+second+"}", dedupKey(texter, "m-1"), dedupKey(texter, "m-2"))
	c.startEdge(t, "E", withFile)
	c.retireEdge(t, "C")
	c.startEdge(t, "F", withFile)
	c.retireEdge(t, "D")
	c.replaceRouter(t, "router-file", bins.router, withFile)
	if after := c.keysNaming(t, second, texter); !maps.Equal(before, after) {
		t.Fatalf("the tenants file changed the legacy phones' keys:\nbefore %v\nafter  %v", before, after)
	}
	phone := c.wake(t, "E", second, queued[second])
	c.sendAgain(t, "F", texter, "m-3", "second marker")

	// The file is in effect: acme's tel-1 connects and gets its cron's
	// delivery, and the legacy phone still gets its own.
	acme, err := c.helloWith(t, "F", tenant.Credential("acme", "app", "acme-app"), "tel-1")
	if err != nil {
		t.Fatalf("hello with an owner's key of the file on a new edge: %v", err)
	}
	c.waitReachable(t, tenant.DeviceKey("acme", "tel-1"))
	if code, body := c.post(t, "/v1/deliver", tenant.Credential("acme", "cron", "acme-cron"), map[string]any{"target": "mobile:tel-1", "text": "for acme"}); code != http.StatusOK {
		t.Fatalf("acme's cron: %d %v", code, body)
	}
	readUntil(t, acme, "acme's delivery", finalText("for acme"))
	c.waitReachable(t, second)
	c.mustDeliver(t, second, "legacy-after", "still yours")
	if _, _, err := phone.CollectMessage(within(t, 15*time.Second), "legacy-after"); err != nil {
		t.Fatalf("the legacy phone after the file came: %v", err)
	}
}

// note appends to queued[dev] a final message of id and text, and
// returns it.
func note(queued map[string][]agentMessage, dev, id, text string) agentMessage {
	m := agentMessage{ID: id, Text: text, Final: true}
	queued[dev] = append(queued[dev], m)
	return m
}

// sleep has dev connect to edge as an app that acks, get a message and
// ack it, and close its socket: the store knows the device acks, so what
// is sent to it while it sleeps is kept in its outbox.
func (c *cluster) sleep(t *testing.T, edge, dev string) {
	t.Helper()
	conn := c.ackingPhone(t, edge, dev)
	c.waitReachable(t, dev)
	c.mustDeliver(t, dev, "before-sleep", "good night")
	if _, _, err := conn.CollectMessage(within(t, 15*time.Second), "before-sleep"); err != nil {
		t.Fatal(err)
	}
	c.hangUp(t, conn, dev)
}

// hangUp closes dev's socket and waits until the store no longer names
// an edge for dev: the keys of a sleeping phone are all there is.
func (c *cluster) hangUp(t *testing.T, conn *client.Conn, dev string) {
	t.Helper()
	conn.CloseNow()
	testsvc.WaitFor(t, 15*time.Second, dev+"'s socket gone from the store", func() bool {
		_, err := c.probe.Owners.DeviceOwner(testCtx(t), dev)
		return err != nil
	})
}

// queue has the agent answer the sleeping dev twice and cron deliver to
// it twice with a ttl of 12 h, through the router's API and through
// cron's deliver frame, and returns the four in the order queued.
func (c *cluster) queue(t *testing.T, dev string, cron *client.Conn) []agentMessage {
	t.Helper()
	ttl := int((12 * time.Hour) / time.Second)
	want := []agentMessage{
		{ID: "answer-1", Text: "the long task is done", Final: true},
		{ID: "answer-2", Text: "and here is the summary", Final: true},
		{ID: dev + "-cron-1", Text: "good morning", Final: true},
		{ID: dev + "-cron-2", Text: "your 7 o'clock", Final: true},
	}
	c.say(t, dev, want[0])
	c.say(t, dev, want[1])
	body := map[string]any{"target": protocol.Session(dev), "id": want[2].ID, "text": want[2].Text, "ttl": ttl}
	if code, answer := c.post(t, "/v1/deliver", c.deliverToken, body); code != http.StatusAccepted || answer["queued"] != true {
		t.Fatalf("cron's deliver with a ttl to the sleeping %s: %d %v, want 202 queued", dev, code, answer)
	}
	if err := cron.Send(map[string]any{"t": protocol.TypeDeliver, "target": dev, "id": want[3].ID, "text": want[3].Text, "ttl": ttl}); err != nil {
		t.Fatal(err)
	}
	if f, err := cron.Expect(within(t, 15*time.Second), protocol.TypeDelivered); err != nil || !f.Bool("queued") || f.Str("id") != want[3].ID {
		t.Fatalf("cron's deliver frame with a ttl to the sleeping %s: %v %v, want delivered queued", dev, f, err)
	}
	return want
}

// wantQueued requires dev's outbox in Redis to hold the items of want,
// in order.
func (c *cluster) wantQueued(t *testing.T, dev string, want []agentMessage) {
	t.Helper()
	items := c.redisClient(t).LRange(testCtx(t), c.prefix+"outbox:{"+dev+"}", 0, -1).Val()
	if len(items) != len(want) {
		t.Fatalf("%s's outbox holds %d items, want %d: %q", dev, len(items), len(want), items)
	}
	for i, it := range items {
		if !strings.Contains(it, `"id":"`+want[i].ID+`"`) || !strings.Contains(it, want[i].Text) {
			t.Fatalf("%s's outbox item %d is %q, want %s's", dev, i, it, want[i].ID)
		}
	}
}

// wake has dev connect to edge as an app that acks and requires it to get
// exactly the messages of want, in order, and nothing more once its
// outbox is acknowledged. It returns the phone, still connected.
func (c *cluster) wake(t *testing.T, edge, dev string, want []agentMessage) *client.Conn {
	t.Helper()
	conn := c.ackingPhone(t, edge, dev)
	var got []agentMessage
	ctx := within(t, 30*time.Second)
	for len(got) < len(want) {
		f, err := conn.Next(ctx)
		if err != nil {
			t.Fatalf("%s awake on %s, after %v: %v", dev, edge, got, err)
		}
		if f.T() == protocol.TypeMessage {
			got = append(got, agentMessage{ID: f.Str("id"), Text: f.Str("text"), Edit: f.Bool("edit"), Final: f.Bool("final")})
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s awake on %s got %v, want %v as queued", dev, edge, got, want)
	}
	testsvc.WaitFor(t, 15*time.Second, dev+"'s outbox acknowledged", func() bool { return outboxLen(t, c, dev) == 0 })
	if ms := messages(pingBarrier(t, conn)); len(ms) > 0 {
		t.Fatalf("%s awake on %s got more than was queued: %q", dev, edge, texts(ms))
	}
	return conn
}

// sendAgain has texter, on edge, send m-1 again (its first text, answered
// by the old release) and then the new text id: the agent answers only
// the new one.
func (c *cluster) sendAgain(t *testing.T, edge, texter, id, text string) {
	t.Helper()
	conn := c.connect(t, edge, texter)
	defer c.hangUp(t, conn, texter)
	if err := conn.Text("m-1", "only once"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Text(id, text); err != nil {
		t.Fatal(err)
	}
	fs := readUntil(t, conn, "the answer to "+id, finalText("You said: "+text))
	if ms := messages(fs); len(ms) != 1 {
		t.Fatalf("on %s, before the answer to %s: %q, want nothing (the agent got m-1 again):%s", edge, id, texts(ms), describe(fs))
	}
	if es := errorsIn(fs); len(es) > 0 {
		t.Fatalf("errors on %s: %v", edge, es)
	}
}

// retireEdge stops edge as a rolling upgrade does: SIGTERM, a drain, and
// exit status 0.
func (c *cluster) retireEdge(t *testing.T, name string) {
	t.Helper()
	retire(t, c.edge(name).Proc)
	c.mu.Lock()
	delete(c.edges, name)
	c.mu.Unlock()
}

// replaceRouter starts a router of bin called name and then retires the
// one running; env is added to the usual settings.
func (c *cluster) replaceRouter(t *testing.T, name, bin string, env ...string) {
	t.Helper()
	p, url := testsvc.StartProc(t, name, bin, nil, append(c.routerEnv(), env...), logMsg("router listening"))
	old := c.router
	c.router, c.routerURL = p, strings.TrimSuffix(url, "/")
	retire(t, old)
}

func retire(t *testing.T, p *testsvc.Proc) {
	t.Helper()
	p.Signal(t, syscall.SIGTERM)
	p.WaitExit(t, 15*time.Second)
	if err := p.Err(); err != nil {
		t.Fatalf("%s exited with %v after SIGTERM, want status 0; its last output:\n%s", p, err, p.LastLines())
	}
}

// redisClient is a client of the cluster's Redis, closed when the test
// ends.
func (c *cluster) redisClient(t *testing.T) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(c.redis)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// keysNaming is every key of the cluster's prefix whose name holds one of
// devs (a device's outbox, its sequence, its dedup keys, ...), without the
// prefix, with its type and content.
func (c *cluster) keysNaming(t *testing.T, devs ...string) map[string]string {
	t.Helper()
	ctx := testCtx(t)
	rdb := c.redisClient(t)
	out := make(map[string]string)
	iter := rdb.Scan(ctx, 0, c.prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if !slices.ContainsFunc(devs, func(d string) bool { return strings.Contains(key, d) }) {
			continue
		}
		typ, err := rdb.Type(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, key).Result()
		case "list":
			v, err = rdb.LRange(ctx, key, 0, -1).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, key).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		default:
			err = fmt.Errorf("a key of type %s", typ)
		}
		if err != nil {
			t.Fatalf("reading %s: %v", key, err)
		}
		out[strings.TrimPrefix(key, c.prefix)] = fmt.Sprintf("%s %q", typ, v)
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no key names %v", devs)
	}
	return out
}

// wantKeys requires snap (keysNaming) to hold keys, so that comparing
// it after the upgrade compares what the test means to.
func wantKeys(t *testing.T, snap map[string]string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := snap[k]; !ok {
			t.Fatalf("no key %s among %v", k, slices.Sorted(maps.Keys(snap)))
		}
	}
}

// dedupKey is the store's key (without the prefix) of a device's text id,
// as the release before owners and this one name it (pkg/edge).
func dedupKey(dev, id string) string { return fmt.Sprintf("dedup:%d:%s:%s", len(dev), dev, id) }

// releaseBuild serializes buildRelease.
var releaseBuild sync.Mutex

// buildRelease builds services/edge and services/router of commit, taken
// from this repository's history with git archive, with the module cache
// and no network (GOPROXY=off). The binaries are kept in the system's
// temporary directory under the commit's name, so a machine builds them
// once. A clone without the commit (a shallow one), a machine without
// git, or a module cache without the commit's modules skips the test
// (fails it in CI).
func buildRelease(t *testing.T, commit string) (edge, router string) {
	t.Helper()
	root, err := testsvc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	git, err := exec.LookPath("git")
	if err != nil {
		testsvc.Missing(t, "git is not on PATH: the upgrade test builds the release before owners from the history")
	}
	out, err := exec.Command(git, "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err != nil {
		testsvc.Missing(t, fmt.Sprintf("commit %s is not in this clone's history (a shallow clone? git fetch --unshallow): the upgrade test builds the release before owners from it", commit))
	}
	full := strings.TrimSpace(string(out))
	// One build at a time in this process (-count runs the test in
	// parallel with itself); the next finds the binaries built.
	releaseBuild.Lock()
	defer releaseBuild.Unlock()
	dir := filepath.Join(os.TempDir(), "hermes-release-"+full[:12])
	edge, router = filepath.Join(dir, "edge"), filepath.Join(dir, "router")
	if isFile(edge) && isFile(router) {
		return edge, router
	}

	src, err := os.MkdirTemp("", "hermes-src-"+full[:12]+"-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(src)
	if err := gitArchive(git, root, full, src); err != nil {
		t.Fatalf("checking out %s: %v", commit, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	goBin, err := testsvc.GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("building the edge and the router of %s (once per machine: a minute or three)", commit)
	for _, b := range []string{edge, router} {
		// Written under a temporary name of its own and renamed: a build
		// cut short leaves no binary that the next run would take as
		// built, and another test binary building the same at once
		// writes a file of its own.
		f, err := os.CreateTemp(dir, filepath.Base(b)+".*.tmp")
		if err != nil {
			t.Fatal(err)
		}
		tmp := f.Name()
		f.Close()
		defer os.Remove(tmp) // gone once renamed
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", tmp, "./services/"+filepath.Base(b))
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly -buildvcs=false")
		msg, err := cmd.CombinedOutput()
		cancel()
		switch {
		case err != nil && strings.Contains(string(msg), "GOPROXY=off"):
			testsvc.Missing(t, fmt.Sprintf("the module cache lacks modules of %s's go.mod (go mod download there once): %s", commit, msg))
		case err != nil:
			t.Fatalf("go build ./services/%s of %s: %v\n%s", filepath.Base(b), commit, err, msg)
		}
		if err := os.Rename(tmp, b); err != nil {
			t.Fatal(err)
		}
	}
	return edge, router
}

// gitArchive writes the tree of commit into dir.
func gitArchive(git, repo, commit, dir string) error {
	cmd := exec.Command(git, "-C", repo, "archive", "--format=tar", commit)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	r, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	errX := extract(tar.NewReader(r), dir)
	_, _ = io.Copy(io.Discard, r) // let git finish whatever happened
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive: %w: %s", err, stderr.String())
	}
	return errX
}

// extract writes the directories, files and symbolic links of tr into dir.
func extract(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("%q is outside the tree", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			err = writeFile(p, tr, os.FileMode(h.Mode).Perm())
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
