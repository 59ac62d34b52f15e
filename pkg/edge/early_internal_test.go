package edge

import (
	"testing"

	"github.com/hermes-mobile/gateway/pkg/store/memstore"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// TestNoticesBeforeRegistration: a notice about a device with no socket
// here may be about a hello between its claim and its registration. A
// takeover at a newer epoch refuses that socket (its edge sent the notice
// here, the edge of the record its claim replaced, and the hello would
// otherwise keep a socket the phone left); an outbox notice has the socket
// read its outbox although its claim found it empty. A notice is used
// once, an older takeover refuses nothing, and the heartbeat's sweep
// forgets what nobody registered for.
func TestNoticesBeforeRegistration(t *testing.T) {
	s := New(Config{ID: "edge-a"}, memstore.New(memstore.Options{}), nil, nil)
	t.Cleanup(func() { s.Close() })
	sock := func(device string, epoch int64) *conn {
		c := &conn{srv: s, session: session{device: device}}
		c.epoch.Store(epoch)
		return c
	}
	register := func(c *conn) (ok, reread bool) {
		t.Helper()
		ok, reread, err := s.register(c)
		if err != nil {
			t.Fatalf("register(%s@%d): %v", c.device, c.epoch.Load(), err)
		}
		return ok, reread
	}

	s.onControl(wire.Control{Op: wire.OpTakeover, Device: "taken", Epoch: 7})
	if ok, _ := register(sock("taken", 5)); ok {
		t.Error("a socket at epoch 5 registered after a takeover at epoch 7 came; want it refused")
	}
	s.onControl(wire.Control{Op: wire.OpTakeover, Device: "older", Epoch: 4})
	if ok, reread := register(sock("older", 5)); !ok || reread {
		t.Errorf("after a takeover at epoch 4, a socket at epoch 5: registered %v, reread %v; want registered, no reread", ok, reread)
	}

	s.onControl(wire.Control{Op: wire.OpOutbox, Device: "kept"})
	if ok, reread := register(sock("kept", 3)); !ok || !reread {
		t.Errorf("after an outbox notice: registered %v, reread %v; want both", ok, reread)
	}
	s.unregister(s.deviceConn("kept"))
	if ok, reread := register(sock("kept", 4)); !ok || reread {
		t.Errorf("the notice used once, the next socket: registered %v, reread %v; want registered, no reread", ok, reread)
	}

	s.onControl(wire.Control{Op: wire.OpOutbox, Device: "nobody"})
	s.forgetEarly(0)
	if ok, reread := register(sock("nobody", 1)); !ok || reread {
		t.Errorf("a notice swept away: registered %v, reread %v; want registered, no reread", ok, reread)
	}
}
