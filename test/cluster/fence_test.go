//go:build unix

package cluster

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hermes-mobile/gateway/internal/testsvc"
	"github.com/hermes-mobile/gateway/pkg/bus"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestDeliveryFencedByOwner: edge A is paused (SIGSTOP: a GC pause, a
// starved CPU, a stalled VM) with a delivery for its phone queued, stamped
// with the phone's epoch on A, as the router stamps it. Meanwhile the phone
// gives up on that socket (without a FIN: its network is gone) and says
// hello on B, which takes a newer epoch. When A wakes, the delivery comes
// before B's takeover notice and A's write into the abandoned socket
// succeeds; A must not answer it as delivered, but as moved, so that the
// router sends it to B.
func TestDeliveryFencedByOwner(t *testing.T) {
	t.Parallel()
	c := newCluster(t, options{})
	dev := newDevice("tel")
	old := c.connect(t, "A", dev)
	defer old.CloseNow() // never read again: the phone forgot it
	owner, err := c.probe.Owners.DeviceOwner(testCtx(t), dev)
	if err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(c.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}

	a := c.edge("A")
	a.Signal(t, syscall.SIGSTOP)
	if err := testsvc.WaitStopped(a.Pid()); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			a.Signal(t, syscall.SIGCONT)
		}
	}()
	out := wire.Output{Op: wire.OpMessage, Device: dev, Epoch: owner.Epoch, ID: "fenced", Text: "written while A was paused", Final: true}
	data, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(bus.EdgeOutputSubject(owner.Edge), inbox, data); err != nil {
		t.Fatal(err)
	}
	// The NATS server has routed it to A before B's hello can publish the
	// takeover notice.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	fresh := c.hello(t, "B", dev)
	defer fresh.CloseNow()
	if now, err := c.probe.Owners.DeviceOwner(testCtx(t), dev); err != nil || now.Epoch <= owner.Epoch {
		t.Fatalf("owner after the hello on B = %+v, %v; want an epoch above %d", now, err, owner.Epoch)
	}
	a.Signal(t, syscall.SIGCONT)
	resumed = true

	msg, err := replies.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no answer from A after it resumed: %v\n%s", err, a.LastLines())
	}
	var r wire.Reply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		t.Fatal(err)
	}
	if r.OK || !r.Moved {
		t.Fatalf("A answered %+v for a write into the socket its phone left for B; want moved, not delivered", r)
	}
}
