package fault

import (
	"fmt"
	"sort"
	"strings"
)

// EchoPrefix starts the demo agent's answer to a text: the final message of
// the answer to text t is EchoPrefix + t.
const EchoPrefix = "You said: "

// Text is a text a phone sent (once, however often it was resent).
type Text struct {
	Device, ID, Text string
}

// Delivery is a POST /v1/deliver the test made, with the router's answer
// (0: no answer: the request failed). Queued: it had a ttl and was
// answered 202 {"queued":true}: kept in the device's outbox, so the
// device must receive it as surely as one answered 200.
type Delivery struct {
	Device, ID, Text string
	Status           int
	Queued           bool
}

// mustArrive says whether the gateway owes d to its device: answered 200
// (the phone has it), or queued for it (202 with a ttl).
func (d Delivery) mustArrive() bool { return d.Status == 200 || d.Status == 202 && d.Queued }

// Frame is a frame a phone received, on the socket it opened as Device.
// Conn numbers the device's connections, from 1.
type Frame struct {
	Device  string
	Conn    int
	T       string
	ID      string
	Text    string
	Final   bool
	Session string // of a ready frame
}

// History is everything a run recorded. Frames are in the order each device
// received them (the order across devices does not matter); Texts in the
// order each device first sent them; Deliveries in any order.
type History struct {
	Texts      []Text
	Deliveries []Delivery
	Frames     []Frame
	// Wire names the device id a phone says in its hello, where it is not
	// the name the history knows it by: with owners, two owners' phones
	// say the same id (the history's "ann/p-000" and "bob/p-000" are both
	// p-000 on the wire), and ready's session is the wire id's.
	Wire map[string]string
}

// wire is the id device says in its hello.
func (h History) wire(device string) string {
	if id, ok := h.Wire[device]; ok {
		return id
	}
	return device
}

// Result is what Check found.
type Result struct {
	Texts      int // texts sent
	Deliveries int // deliveries requested
	Delivered  int // deliveries answered 200
	Queued     int // deliveries with a ttl answered 202 queued

	LostTexts      []string // ids of texts never answered on their device
	LostDeliveries []string // ids answered 200 or queued and never received by their device
	Misrouted      []string // frames for one device received on another's socket

	Duplicates int // answers and deliveries received more than once (each extra copy)
	Reordered  int // answers and deliveries received after a later one of the same device
}

// Lost is the number of lost texts and deliveries.
func (r Result) Lost() int { return len(r.LostTexts) + len(r.LostDeliveries) }

// Summary is the one-line report of a run.
func (r Result) Summary() string {
	return fmt.Sprintf("texts=%d deliveries=%d delivered=%d queued=%d lost=%d misrouted=%d duplicates=%d reordered=%d",
		r.Texts, r.Deliveries, r.Delivered, r.Queued, r.Lost(), len(r.Misrouted), r.Duplicates, r.Reordered)
}

// Check reads a history. A text is answered when its device received the
// final message "You said: <text>"; a delivery answered 200, or queued (a
// ttl, 202 {"queued":true}), is received when its device received the
// final message with the delivery's id. A frame
// belongs to the device whose text it answers, whose delivery it carries, or
// whose session it names (ready); one received on another device's socket
// is misrouted. Frames that belong to no known text or delivery (the first
// parts of a streamed answer, pongs, avatar states) are not judged.
func Check(h History) Result {
	r := Result{Texts: len(h.Texts), Deliveries: len(h.Deliveries)}

	textOf := make(map[string]int, len(h.Texts)) // answer text -> index in h.Texts
	for i, t := range h.Texts {
		textOf[EchoPrefix+t.Text] = i
	}
	delOf := make(map[string]int, len(h.Deliveries)) // id -> index in h.Deliveries
	for i, d := range h.Deliveries {
		delOf[d.ID] = i
		switch {
		case d.Status == 200:
			r.Delivered++
		case d.mustArrive():
			r.Queued++
		}
	}
	// Rank of each text and delivery among its device's, in sending order.
	textRank := make([]int, len(h.Texts))
	next := make(map[string]int)
	for i, t := range h.Texts {
		textRank[i] = next[t.Device]
		next[t.Device]++
	}
	delRank := make([]int, len(h.Deliveries))
	next = make(map[string]int)
	for i, d := range h.Deliveries {
		delRank[i] = next[d.Device]
		next[d.Device]++
	}

	answers := make([]int, len(h.Texts))
	received := make([]int, len(h.Deliveries))
	maxText := make(map[string]int) // device -> highest text rank answered so far, +1
	maxDel := make(map[string]int)
	for _, f := range h.Frames {
		if f.T == "ready" {
			if want := "mobile:" + h.wire(f.Device); f.Session != want {
				r.Misrouted = append(r.Misrouted, fmt.Sprintf("ready for %s on %s's socket (connection %d)", f.Session, f.Device, f.Conn))
			}
			continue
		}
		if f.T != "message" || !f.Final {
			continue
		}
		if i, ok := textOf[f.Text]; ok {
			t := h.Texts[i]
			if t.Device != f.Device {
				r.Misrouted = append(r.Misrouted, fmt.Sprintf("answer to %s (%s) on %s's socket (connection %d)", t.ID, t.Device, f.Device, f.Conn))
				continue
			}
			answers[i]++
			if answers[i] > 1 {
				r.Duplicates++
				continue
			}
			if textRank[i]+1 < maxText[f.Device] {
				r.Reordered++
			}
			maxText[f.Device] = max(maxText[f.Device], textRank[i]+1)
			continue
		}
		if i, ok := delOf[f.ID]; ok {
			d := h.Deliveries[i]
			if d.Device != f.Device {
				r.Misrouted = append(r.Misrouted, fmt.Sprintf("delivery %s (%s) on %s's socket (connection %d)", d.ID, d.Device, f.Device, f.Conn))
				continue
			}
			received[i]++
			if received[i] > 1 {
				r.Duplicates++
				continue
			}
			if delRank[i]+1 < maxDel[f.Device] {
				r.Reordered++
			}
			maxDel[f.Device] = max(maxDel[f.Device], delRank[i]+1)
		}
	}
	for i, t := range h.Texts {
		if answers[i] == 0 {
			r.LostTexts = append(r.LostTexts, t.ID)
		}
	}
	for i, d := range h.Deliveries {
		if d.mustArrive() && received[i] == 0 {
			r.LostDeliveries = append(r.LostDeliveries, d.ID)
		}
	}
	sort.Strings(r.LostTexts)
	sort.Strings(r.LostDeliveries)
	return r
}

// Trace is what the history shows of one device: every text, delivery and
// judged frame, in order, for a report about a lost or misrouted id.
func Trace(h History, device string) string {
	var b strings.Builder
	for _, t := range h.Texts {
		if t.Device == device {
			fmt.Fprintf(&b, "  sent text %s %q\n", t.ID, t.Text)
		}
	}
	for _, d := range h.Deliveries {
		if d.Device == device {
			fmt.Fprintf(&b, "  deliver %s: %d queued=%v\n", d.ID, d.Status, d.Queued)
		}
	}
	for _, f := range h.Frames {
		if f.Device != device || f.T == "pong" || f.T == "avatar" || f.T == "typing" {
			continue
		}
		switch f.T {
		case "ready":
			fmt.Fprintf(&b, "  conn %d: ready %s\n", f.Conn, f.Session)
		case "error":
			fmt.Fprintf(&b, "  conn %d: error %s\n", f.Conn, f.Text)
		default:
			fmt.Fprintf(&b, "  conn %d: %s id=%s final=%v %q\n", f.Conn, f.T, f.ID, f.Final, f.Text)
		}
	}
	return b.String()
}
