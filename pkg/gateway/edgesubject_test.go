package gateway_test

import (
	"fmt"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/bus/natsbus"
	"github.com/hermes-mobile/gateway/pkg/gateway"
	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestPhonesCostTheBusNoSubscription: deliveries reach a phone through its
// edge's subject, so a phone's hello subscribes to nothing: the NATS
// server's subscriptions do not grow with the phones, and every phone gets
// the agent's answer. With MOBILE_DEVICE_SUBJECTS (a rolling upgrade) each
// phone costs a subscription, as before edge subjects.
func TestPhonesCostTheBusNoSubscription(t *testing.T) {
	const phones = 40
	for _, deviceSubjects := range []bool{false, true} {
		t.Run(fmt.Sprintf("device subjects %v", deviceSubjects), func(t *testing.T) {
			n := startNode(t, func(cfg *gateway.Config) { cfg.Edge.DeviceSubjects = deviceSubjects })
			srv := n.Bus.(*natsbus.Bus).Server()
			var before uint32
			for i := range phones {
				if i == 1 {
					// After the first round trip: its reply subscription
					// (nats.go's, one per connection) is there.
					before = srv.NumSubscriptions()
				}
				c, _ := n.connect(t, fmt.Sprintf("tel-%d", i))
				if err := c.Text("m-1", "hello"); err != nil {
					t.Fatal(err)
				}
				for {
					f, err := c.Next(testCtx(t))
					if err != nil {
						t.Fatalf("phone %d: no answer: %v", i, err)
					}
					if f.T() == protocol.TypeMessage && f.Bool("final") {
						break
					}
				}
			}
			grew := int(srv.NumSubscriptions()) - int(before)
			want := 0
			if deviceSubjects {
				want = phones - 1
			}
			if grew != want {
				t.Fatalf("%d phones grew the NATS server's subscriptions by %d, want %d", phones-1, grew, want)
			}
		})
	}
}
