package protocol_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// TestDeliverTarget: mobile:<id> and a bare <id> name the device, an empty
// target the home device; a device id of 120 characters (code points, not
// bytes) is one a device can have, 121 is bad_frame, as is no target
// without a home device.
func TestDeliverTarget(t *testing.T) {
	at := strings.Repeat("é", protocol.MaxDeviceFieldChars) // 240 bytes, 120 characters
	past := strings.Repeat("d", protocol.MaxDeviceFieldChars+1)
	for _, tc := range []struct {
		target, home, want string
		bad                bool
	}{
		{target: "mobile:tel-1", want: "tel-1"},
		{target: "tel-1", want: "tel-1"},
		{target: "", home: "home-1", want: "home-1"},
		{target: "tel-1", home: "home-1", want: "tel-1"},
		{target: "", bad: true},
		{target: "mobile:" + at, want: at},
		{target: at, want: at},
		{target: "mobile:" + past, bad: true},
		{target: past, bad: true},
		{target: "", home: past, bad: true},
	} {
		got, e := protocol.DeliverTarget(tc.target, tc.home)
		switch {
		case tc.bad && (e == nil || e.Code != protocol.CodeBadFrame):
			t.Errorf("DeliverTarget(%.20q…, %.20q…) = %.20q, %v; want bad_frame", tc.target, tc.home, got, e)
		case !tc.bad && (e != nil || got != tc.want):
			t.Errorf("DeliverTarget(%.20q…, %.20q…) = %.20q, %v; want %.20q", tc.target, tc.home, got, e, tc.want)
		}
	}
	if err := protocol.CheckDeviceID(at); err != nil {
		t.Errorf("CheckDeviceID of 120 characters: %v", err)
	}
	var e *protocol.Error
	if err := protocol.CheckDeviceID(past); !errors.As(err, &e) || e.Code != protocol.CodeBadFrame {
		t.Errorf("CheckDeviceID of 121 characters: %v, want bad_frame", err)
	}
}

// TestDeliverBodyIsTheFrame: the deliver frame and a DeliverBody (POST
// /v1/deliver's JSON) are validated by the one Frame: the same input
// gives the same Deliver or the same error code.
func TestDeliverBodyIsTheFrame(t *testing.T) {
	for _, body := range []string{
		`"id":"a","target":"mobile:tel","text":"hi"`,
		`"id":"a","text":"hi","wait":"ack"`,
		`"id":"a","text":"hi","wait":"read"`,
		`"id":"a"`,
		`"id":"a","target":"` + strings.Repeat("d", 121) + `","text":"x"`,
		`"id":"a","media":{"kind":"IMAGE","filename":"a.png","data":"cG5n"}`,
		`"id":"a","media":{"kind":"audio","data":"cG5n"}`,
		`"id":"a","media":{"kind":"image"}`,
		`"id":"a","text":"hi","ttl":1`,
		`"id":"a","text":"hi","ttl":2147483648`,
		`"id":"a","text":"hi","ttl":2147483649`,
		`"id":"a","text":"hi","ttl":0`,
		`"id":"a","text":"hi","ttl":-5`,
		`"id":"a","text":"hi","ttl":2.5`,
		`"id":"a","text":"hi","ttl":null`,
	} {
		f, ferr := protocol.Decode([]byte(`{"t":"deliver",` + body + `}`))
		var b protocol.DeliverBody
		if err := json.Unmarshal([]byte(`{`+body+`}`), &b); err != nil {
			t.Fatal(err)
		}
		d, e := b.Frame()
		var fe *protocol.Error
		errors.As(ferr, &fe)
		switch {
		case (fe == nil) != (e == nil):
			t.Errorf("%s: frame %v, body %v", body, ferr, e)
		case fe != nil && fe.Code != e.Code:
			t.Errorf("%s: frame %s, body %s", body, fe.Code, e.Code)
		case fe == nil:
			fd := f.(*protocol.Deliver)
			if fd.ID != d.ID || fd.Target != d.Target || fd.Text != d.Text || fd.WaitAck != d.WaitAck || fd.TTL != d.TTL || (fd.Media == nil) != (d.Media == nil) ||
				fd.Media != nil && (fd.Media.Kind != d.Media.Kind || fd.Media.Mime != d.Media.Mime || string(fd.Media.Data) != string(d.Media.Data)) {
				t.Errorf("%s: frame %+v, body %+v", body, fd, d)
			}
		}
	}
}

// TestDeliverTTL: a deliver's ttl is a whole number of seconds from 1 to
// MaxDeliverTTLSeconds (a service's own bound, MOBILE_OUTBOX_TTL, is
// checked where the delivery is carried out); anything else is bad_frame;
// absent (or null) is no ttl.
func TestDeliverTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl  string
		want time.Duration
		bad  bool
	}{
		{ttl: "1", want: time.Second},
		{ttl: "86400", want: 24 * time.Hour},
		{ttl: "2147483648", want: protocol.MaxDeliverTTLSeconds * time.Second},
		{ttl: "2147483649", bad: true},
		{ttl: "0", bad: true},
		{ttl: "-1", bad: true},
		{ttl: "0.5", bad: true},
		{ttl: "null"},
	} {
		f, err := protocol.Decode([]byte(`{"t":"deliver","id":"a","text":"hi","ttl":` + tc.ttl + `}`))
		var e *protocol.Error
		switch {
		case tc.bad && (!errors.As(err, &e) || e.Code != protocol.CodeBadFrame):
			t.Errorf("ttl %s: %v, want bad_frame", tc.ttl, err)
		case !tc.bad && err != nil:
			t.Errorf("ttl %s: %v", tc.ttl, err)
		case !tc.bad && f.(*protocol.Deliver).TTL != tc.want:
			t.Errorf("ttl %s: %v, want %v", tc.ttl, f.(*protocol.Deliver).TTL, tc.want)
		}
	}
}
