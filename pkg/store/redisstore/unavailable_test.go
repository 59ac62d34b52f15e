package redisstore

import (
	"errors"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/store"
)

// replyErr is a Redis error reply, as go-redis returns one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestUnavailableDuringFailover: the replies a Redis Cluster gives while a
// failover moves slots (the cluster client passes MOVED or ASK on once its
// redirects ran out) mean "try again", as CLUSTERDOWN and TRYAGAIN do; a
// reply about the call itself does not. Found by the clustered fault test:
// an agent's answer whose PushOutbox got MOVED right after a failover was
// dropped instead of kept and tried again.
func TestUnavailableDuringFailover(t *testing.T) {
	for _, c := range []struct {
		reply string
		want  bool
	}{
		{"MOVED 6430 127.0.0.1:38777", true},
		{"ASK 6430 127.0.0.1:38777", true},
		{"CLUSTERDOWN The cluster is down", true},
		{"TRYAGAIN Multiple keys request during rehashing of slot", true},
		{"ERR wrong number of arguments for 'set' command", false},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false},
	} {
		err := redisErr(t.Context(), "PushOutbox", replyErr(c.reply))
		if got := errors.Is(err, store.ErrUnavailable); got != c.want {
			t.Errorf("%q: unavailable = %v, want %v (%v)", c.reply, got, c.want, err)
		}
	}
}
