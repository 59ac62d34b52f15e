package fault

import (
	"reflect"
	"testing"
)

// cleanHistory is two devices that got everything, with one duplicate
// answer and one delivery received out of order.
func cleanHistory() History {
	return History{
		Texts: []Text{
			{Device: "a", ID: "a-1", Text: "a t1"},
			{Device: "a", ID: "a-2", Text: "a t2"},
			{Device: "b", ID: "b-1", Text: "b t1"},
		},
		Deliveries: []Delivery{
			{Device: "a", ID: "a.d1", Text: "cron a.d1", Status: 200},
			{Device: "a", ID: "a.d2", Text: "cron a.d2", Status: 200},
			{Device: "b", ID: "b.d1", Text: "cron b.d1", Status: 404},
			{Device: "b", ID: "b.d2", Text: "cron b.d2", Status: 202, Queued: true},
			{Device: "b", ID: "b.d3", Text: "cron b.d3", Status: 202},
		},
		Frames: []Frame{
			{Device: "a", Conn: 1, T: "ready", Session: "mobile:a"},
			{Device: "b", Conn: 1, T: "ready", Session: "mobile:b"},
			{Device: "a", Conn: 1, T: "message", ID: "r-1", Text: "You said: "},
			{Device: "a", Conn: 1, T: "message", ID: "r-1", Text: "You said: a t1", Final: true},
			{Device: "a", Conn: 1, T: "message", ID: "a.d2", Text: "cron a.d2", Final: true},
			{Device: "a", Conn: 2, T: "ready", Session: "mobile:a"},
			{Device: "a", Conn: 2, T: "message", ID: "a.d1", Text: "cron a.d1", Final: true},
			{Device: "a", Conn: 2, T: "message", ID: "r-2", Text: "You said: a t2", Final: true},
			{Device: "a", Conn: 2, T: "message", ID: "r-2", Text: "You said: a t2", Final: true},
			{Device: "b", Conn: 1, T: "message", ID: "r-3", Text: "You said: b t1", Final: true},
			{Device: "b", Conn: 2, T: "ready", Session: "mobile:b"},
			{Device: "b", Conn: 2, T: "message", ID: "b.d2", Text: "cron b.d2", Final: true},
		},
	}
}

func TestCheckClean(t *testing.T) {
	r := Check(cleanHistory())
	want := Result{Texts: 3, Deliveries: 5, Delivered: 2, Queued: 1, Duplicates: 1, Reordered: 1}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("Check = %+v, want %+v", r, want)
	}
	if r.Summary() != "texts=3 deliveries=5 delivered=2 queued=1 lost=0 misrouted=0 duplicates=1 reordered=1" {
		t.Fatalf("Summary = %q", r.Summary())
	}
}

func TestCheckCatchesLostText(t *testing.T) {
	h := cleanHistory()
	h.Texts = append(h.Texts, Text{Device: "b", ID: "b-2", Text: "b t2"})
	// The first parts of a streamed answer are not an answer.
	h.Frames = append(h.Frames, Frame{Device: "b", Conn: 1, T: "message", ID: "r-4", Text: "You said: b t2"})
	r := Check(h)
	if !reflect.DeepEqual(r.LostTexts, []string{"b-2"}) || r.Lost() != 1 {
		t.Fatalf("LostTexts = %v (lost %d), want [b-2]", r.LostTexts, r.Lost())
	}
}

func TestCheckCatchesLostDelivery(t *testing.T) {
	h := cleanHistory()
	// Answered 200 or queued (a ttl), never received; a 404 or a 202 not
	// queued never received is no loss.
	h.Deliveries = append(h.Deliveries,
		Delivery{Device: "b", ID: "b.d5", Text: "cron b.d5", Status: 200},
		Delivery{Device: "b", ID: "b.d6", Text: "cron b.d6", Status: 404},
		Delivery{Device: "b", ID: "b.d7", Text: "cron b.d7", Status: 202},
		Delivery{Device: "b", ID: "b.d8", Text: "cron b.d8", Status: 202, Queued: true},
	)
	r := Check(h)
	if !reflect.DeepEqual(r.LostDeliveries, []string{"b.d5", "b.d8"}) || r.Lost() != 2 {
		t.Fatalf("LostDeliveries = %v (lost %d), want [b.d5 b.d8]", r.LostDeliveries, r.Lost())
	}
}

func TestCheckCatchesMisroute(t *testing.T) {
	for name, f := range map[string]Frame{
		"answer":   {Device: "b", Conn: 1, T: "message", ID: "r-1", Text: "You said: a t1", Final: true},
		"delivery": {Device: "b", Conn: 1, T: "message", ID: "a.d1", Text: "cron a.d1", Final: true},
		"ready":    {Device: "b", Conn: 2, T: "ready", Session: "mobile:a"},
	} {
		t.Run(name, func(t *testing.T) {
			h := cleanHistory()
			h.Frames = append(h.Frames, f)
			r := Check(h)
			if len(r.Misrouted) != 1 {
				t.Fatalf("Misrouted = %q, want one", r.Misrouted)
			}
			if r.Lost() != 0 {
				t.Fatalf("lost %d, want 0", r.Lost())
			}
		})
	}
}

// A misrouted answer is not an answer: the text it answers is lost too.
func TestCheckMisrouteIsNoAnswer(t *testing.T) {
	h := cleanHistory()
	h.Texts = append(h.Texts, Text{Device: "b", ID: "b-2", Text: "b t2"})
	h.Frames = append(h.Frames, Frame{Device: "a", Conn: 2, T: "message", ID: "r-9", Text: "You said: b t2", Final: true})
	r := Check(h)
	if len(r.Misrouted) != 1 || !reflect.DeepEqual(r.LostTexts, []string{"b-2"}) {
		t.Fatalf("Misrouted = %q, LostTexts = %v; want one and [b-2]", r.Misrouted, r.LostTexts)
	}
}

// With owners two phones say the same device id: ready's session is the
// wire id's, and what one owner's phone got of the other's is misrouted.
func TestCheckOwnersShareWireIDs(t *testing.T) {
	h := History{
		Texts: []Text{
			{Device: "ann/p", ID: "ann/p-t1", Text: "ann/p t1"},
			{Device: "bob/p", ID: "bob/p-t1", Text: "bob/p t1"},
		},
		Deliveries: []Delivery{{Device: "ann/p", ID: "ann/p.d1", Text: "cron ann/p.d1", Status: 200}},
		Frames: []Frame{
			{Device: "ann/p", Conn: 1, T: "ready", Session: "mobile:p"},
			{Device: "bob/p", Conn: 1, T: "ready", Session: "mobile:p"},
			{Device: "ann/p", Conn: 1, T: "message", ID: "r-1", Text: "You said: ann/p t1", Final: true},
			{Device: "ann/p", Conn: 1, T: "message", ID: "ann/p.d1", Text: "cron ann/p.d1", Final: true},
			{Device: "bob/p", Conn: 1, T: "message", ID: "r-2", Text: "You said: bob/p t1", Final: true},
		},
		Wire: map[string]string{"ann/p": "p", "bob/p": "p"},
	}
	if r := Check(h); r.Lost() != 0 || len(r.Misrouted) != 0 {
		t.Fatalf("clean owners' history: lost %d, misrouted %q", r.Lost(), r.Misrouted)
	}
	for name, f := range map[string]Frame{
		"ready of the history's name": {Device: "ann/p", Conn: 2, T: "ready", Session: "mobile:ann/p"},
		"the other owner's delivery":  {Device: "bob/p", Conn: 1, T: "message", ID: "ann/p.d1", Text: "cron ann/p.d1", Final: true},
		"the other owner's answer":    {Device: "bob/p", Conn: 1, T: "message", ID: "r-3", Text: "You said: ann/p t1", Final: true},
	} {
		t.Run(name, func(t *testing.T) {
			h2 := h
			h2.Frames = append(append([]Frame(nil), h.Frames...), f)
			if r := Check(h2); len(r.Misrouted) != 1 {
				t.Fatalf("Misrouted = %q, want one", r.Misrouted)
			}
		})
	}
}
