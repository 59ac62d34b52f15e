//go:build unix

package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/client"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/push"
	"github.com/hermes-mobile/gateway/pkg/store/redisstore"
)

// TestSleepingPhoneMissesNothing: a phone that acks goes to sleep (its
// socket closes). The agent answers twice meanwhile, and cron queues two
// deliveries with a ttl: POST /v1/deliver (202 queued) and a deliver frame
// on edge A (delivered, queued), which an edge process keeps without a
// router of its own. All four are kept in the outbox well past the 10
// minutes of earlier versions (the agent's deadlines and the key's TTL
// about a day away, cron's its ttl of 12 h), a single signed push
// notification reaches the device's push endpoint for the burst, and the
// phone, waking on the other edge, receives them, in order, and acks them.
func TestSleepingPhoneMissesNothing(t *testing.T) {
	t.Parallel()
	key := "push-key-" + testsvc.RandomHex(8)
	// The push endpoint is the test's, on loopback, which push refuses
	// unless allowed.
	c := newCluster(t, options{routerEnv: []string{"MOBILE_PUSH_KEY=" + key, "MOBILE_PUSH_ALLOW_NETS=127.0.0.1/32"}})
	dev := newDevice("tel-sleep")

	var mu sync.Mutex
	var pushes [][]byte
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !push.Verify([]byte(key), body, r.Header.Get(push.SignatureHeader)) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		pushes = append(pushes, body)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	if code := c.put(t, "/v1/devices/"+dev+"/push", c.agentToken, push.Target{Kind: push.KindWebhook, URL: hook.URL + "/wake"}); code != http.StatusOK {
		t.Fatalf("registering the push endpoint: %d", code)
	}

	// Awake on edge A: a message arrives and is acked, so the store knows
	// the device acks.
	onA := c.ackingPhone(t, "A", dev)
	c.waitReachable(t, dev)
	c.mustDeliver(t, dev, "before-sleep", "good night")
	if _, _, err := onA.CollectMessage(within(t, 15*time.Second), "before-sleep"); err != nil {
		t.Fatal(err)
	}
	onA.CloseNow()
	testsvc.WaitFor(t, 15*time.Second, "the phone's socket gone from the store", func() bool {
		_, err := c.probe.Owners.DeviceOwner(testCtx(t), dev)
		return err != nil
	})

	// Asleep: the agent answers, twice.
	answers := []agentMessage{{ID: "answer-1", Text: "the long task is done", Final: true}, {ID: "answer-2", Text: "and here is the summary", Final: true}}
	for _, m := range answers {
		c.say(t, dev, m)
	}
	// Cron, with a ttl of 12 h: queued, not refused.
	const cronTTL = 12 * time.Hour
	cronBody := map[string]any{"target": protocol.Session(dev), "id": "cron-1", "text": "good morning", "ttl": int(cronTTL / time.Second)}
	if code, body := c.post(t, "/v1/deliver", c.deliverToken, cronBody); code != http.StatusAccepted || body["queued"] != true || body["id"] != "cron-1" {
		t.Fatalf("cron's deliver with a ttl to the sleeping phone: %d %v, want 202 queued", code, body)
	}
	cronFrame := c.hello(t, "A", newDevice("cron")) // loopback: may deliver
	if err := cronFrame.Send(map[string]any{"t": protocol.TypeDeliver, "target": dev, "id": "cron-2", "text": "your 7 o'clock", "ttl": int(cronTTL / time.Second)}); err != nil {
		t.Fatal(err)
	}
	if f, err := cronFrame.Expect(within(t, 15*time.Second), protocol.TypeDelivered); err != nil || !f.Bool("queued") || f.Str("id") != "cron-2" {
		t.Fatalf("cron's deliver frame with a ttl to the sleeping phone: %v %v, want delivered queued", f, err)
	}
	answers = append(answers, agentMessage{ID: "cron-1", Text: "good morning"}, agentMessage{ID: "cron-2", Text: "your 7 o'clock"})
	wantOutboxLen(t, c, dev, int64(len(answers)))

	// Kept for a day, not 10 minutes.
	rdb, err := redisstore.NewClient(c.redisMode, c.redis, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := testCtx(t)
	outboxKey := c.prefix + "outbox:{" + dev + "}"
	if ttl := rdb.PTTL(ctx, outboxKey).Val(); ttl < 23*time.Hour {
		t.Fatalf("the outbox key's TTL is %v, want about a day", ttl)
	}
	items := rdb.LRange(ctx, outboxKey, 0, -1).Val()
	now := time.Now()
	if len(items) != len(answers) {
		t.Fatalf("the outbox holds %d items, want %d", len(items), len(answers))
	}
	for i, it := range items {
		f := strings.SplitN(it, "|", 3)
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("outbox item %d %.60q: %v", i, it, err)
		}
		// The agent's answers for a day; cron's for its ttl.
		want := 24 * time.Hour
		if strings.HasPrefix(answers[i].ID, "cron-") {
			want = cronTTL
		}
		if left := time.UnixMilli(ms).Sub(now); left < want-time.Hour || left > want {
			t.Fatalf("outbox item %d (%s) is kept %v more, want about %v (well past 10 min)", i, answers[i].ID, left, want)
		}
		if !strings.Contains(it, answers[i].ID) {
			t.Fatalf("outbox item %d is %.80q, want %s's", i, it, answers[i].ID)
		}
	}

	// One notification for the burst, without the messages' text.
	testsvc.WaitFor(t, 15*time.Second, "a push notification", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(pushes) > 0
	})
	c.say(t, dev, agentMessage{ID: "answer-3", Text: "one more thing", Final: true})
	answers = append(answers, agentMessage{ID: "answer-3", Text: "one more thing"})
	wantOutboxLen(t, c, dev, int64(len(answers)))
	// The third output is the sentinel: pushes are sent within
	// milliseconds, so a second one would be in by the time the phone
	// below has read everything; it is checked then.

	// Awake on edge B: the agent's answers and cron's deliveries, in the
	// order sent, acked.
	onB := c.ackingPhone(t, "B", dev)
	var got []agentMessage
	ctx = within(t, 30*time.Second)
	for len(got) < len(answers) {
		f, err := onB.Next(ctx)
		if err != nil {
			t.Fatalf("on B, after %v: %v", got, err)
		}
		if f.T() == protocol.TypeMessage && f.Bool("final") {
			got = append(got, agentMessage{ID: f.Str("id"), Text: f.Str("text")})
		}
	}
	for i, m := range answers {
		if got[i].ID != m.ID || got[i].Text != m.Text {
			t.Fatalf("on B, the messages came as %v, want %v", got, answers)
		}
	}
	testsvc.WaitFor(t, 15*time.Second, "the outbox acknowledged from B", func() bool { return outboxLen(t, c, dev) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(pushes) != 1 {
		t.Fatalf("%d push notifications for one burst, want 1: %q", len(pushes), pushes)
	}
	var nt push.Notice
	if err := json.Unmarshal(pushes[0], &nt); err != nil || nt.Device != dev || bytes.Contains(pushes[0], []byte("long task")) {
		t.Fatalf("push notification %s (%v), want one naming %s without the text", pushes[0], err, dev)
	}
}

// ackingPhone dials the edge as an app that acks every message, and says
// hello as dev.
func (c *cluster) ackingPhone(t *testing.T, edge, dev string) *client.Conn {
	t.Helper()
	conn, err := client.Dial(testCtx(t), c.edge(edge).url, client.Options{Timeout: 5 * time.Second, WriteTimeout: 10 * time.Second, AutoAck: true})
	if err != nil {
		t.Fatalf("dial edge %s: %v", edge, err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	if _, err := conn.Hello(testCtx(t), c.token, device(dev), user); err != nil {
		t.Fatalf("hello as %s on %s: %v", dev, edge, err)
	}
	return conn
}

// put sends body as JSON with PUT and returns the status.
func (c *cluster) put(t *testing.T, path, token string, body any) int {
	t.Helper()
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.routerURL+path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
