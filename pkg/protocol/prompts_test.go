package protocol_test

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/protocol"
)

// The "Question cards" table of the specification:
//
//	exec_approval  once, session, always, deny      unknown → deny
//	slash_confirm  once, always, cancel              unknown → cancel
//	clarify        c0, c1, … (option order), other   unknown → other
func TestResolveOption(t *testing.T) {
	const (
		exec    = protocol.PromptExecApproval
		slash   = protocol.PromptSlashConfirm
		clarify = protocol.PromptClarify
	)
	tests := []struct {
		kind, option, text string
		n                  int
		want               string
	}{
		// exec_approval: the four valid options.
		{exec, "once", "", 0, "once"},
		{exec, "session", "", 0, "session"},
		{exec, "always", "", 0, "always"},
		{exec, "deny", "", 0, "deny"},
		// exec_approval: anything else is deny.
		{exec, "cancel", "", 0, "deny"},
		{exec, "other", "", 0, "deny"},
		{exec, "c0", "", 1, "deny"},
		{exec, "ONCE", "", 0, "deny"},
		{exec, "once ", "", 0, "deny"},
		{exec, "yes", "", 0, "deny"},
		{exec, "", "", 0, "deny"},
		// exec_approval: text is the option when option_id is empty.
		{exec, "", "always", 0, "always"},
		{exec, "", "session", 0, "session"},
		{exec, "", "please allow", 0, "deny"},
		{exec, "deny", "always", 0, "deny"}, // option_id wins over text
		{exec, "bogus", "always", 0, "deny"},

		// slash_confirm: the three valid options.
		{slash, "once", "", 0, "once"},
		{slash, "always", "", 0, "always"},
		{slash, "cancel", "", 0, "cancel"},
		// slash_confirm: anything else is cancel.
		{slash, "session", "", 0, "cancel"},
		{slash, "deny", "", 0, "cancel"},
		{slash, "other", "", 0, "cancel"},
		{slash, "Always", "", 0, "cancel"},
		{slash, "", "", 0, "cancel"},
		// slash_confirm: text is the option when option_id is empty.
		{slash, "", "once", 0, "once"},
		{slash, "", "sure", 0, "cancel"},
		{slash, "cancel", "always", 0, "cancel"},

		// clarify with three proposed answers: c0..c2 are valid.
		{clarify, "c0", "", 3, "c0"},
		{clarify, "c1", "", 3, "c1"},
		{clarify, "c2", "", 3, "c2"},
		// clarify: cN with N >= n, malformed cN and the rest are other.
		{clarify, "c3", "", 3, "other"},
		{clarify, "c10", "", 3, "other"},
		{clarify, "c01", "", 3, "other"},
		{clarify, "c00", "", 3, "other"},
		{clarify, "c", "", 3, "other"},
		{clarify, "c-1", "", 3, "other"},
		{clarify, "c+1", "", 3, "other"},
		{clarify, "c1 ", "", 3, "other"},
		{clarify, "C1", "", 3, "other"},
		{clarify, "c١", "", 3, "other"}, // ARABIC-INDIC DIGIT ONE
		{clarify, "1", "", 3, "other"},
		{clarify, "once", "", 3, "other"},
		{clarify, "other", "", 3, "other"},
		{clarify, "other", "my own answer", 3, "other"},
		{clarify, "c0", "", 0, "other"},
		// clarify: text is the custom answer, never an option.
		{clarify, "", "c1", 3, "other"},
		{clarify, "", "free text", 3, "other"},
		// clarify: a larger card and absurd indices.
		{clarify, "c11", "", 12, "c11"},
		{clarify, "c12", "", 12, "other"},
		{clarify, "c" + strings.Repeat("9", 30), "", math.MaxInt, "other"},
		{clarify, "c18446744073709551617", "", math.MaxInt, "other"}, // wraps to 1 in uint64
	}
	for _, tt := range tests {
		got := protocol.ResolveOption(tt.kind, tt.option, tt.text, tt.n)
		if got != tt.want {
			t.Errorf("ResolveOption(%q, option %q, text %q, %d) = %q, want %q", tt.kind, tt.option, tt.text, tt.n, got, tt.want)
		}
	}
}

func TestSafeOption(t *testing.T) {
	for kind, want := range map[string]string{
		protocol.PromptExecApproval: "deny",
		protocol.PromptSlashConfirm: "cancel",
		protocol.PromptClarify:      "other",
	} {
		if got := protocol.SafeOption(kind); got != want {
			t.Errorf("SafeOption(%q) = %q, want %q", kind, got, want)
		}
	}
}

func TestPromptOptions(t *testing.T) {
	tests := []struct {
		kind    string
		choices []string
		ids     []string
		labels  []string // nil: not checked
	}{
		{protocol.PromptExecApproval, nil, []string{"once", "session", "always", "deny"}, nil},
		{protocol.PromptSlashConfirm, nil, []string{"once", "always", "cancel"}, nil},
		{protocol.PromptClarify, nil, []string{"other"}, nil},
		{protocol.PromptClarify, []string{"red", "green", "blue"}, []string{"c0", "c1", "c2", "other"},
			[]string{"red", "green", "blue", "Other…"}},
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			opts := protocol.PromptOptions(tt.kind, tt.choices)
			var ids, labels []string
			for _, o := range opts {
				ids = append(ids, o.ID)
				labels = append(labels, o.Label)
				if o.Style != "" && o.Style != "primary" && o.Style != "danger" {
					t.Errorf("option %q has style %q, want primary, danger or empty", o.ID, o.Style)
				}
				if o.Label == "" {
					t.Errorf("option %q has no label", o.ID)
				}
				// Every button the server offers must survive validation.
				if got := protocol.ResolveOption(tt.kind, o.ID, "", len(tt.choices)); got != o.ID {
					t.Errorf("ResolveOption of offered option %q = %q", o.ID, got)
				}
			}
			if !reflect.DeepEqual(ids, tt.ids) {
				t.Errorf("option ids = %v, want %v", ids, tt.ids)
			}
			if tt.labels != nil && !reflect.DeepEqual(labels, tt.labels) {
				t.Errorf("labels = %v, want %v", labels, tt.labels)
			}
		})
	}
	if opts := protocol.PromptOptions("poll", []string{"a"}); opts != nil {
		t.Errorf("PromptOptions of an unknown kind = %v, want nil", opts)
	}
}

func TestIsPromptKind(t *testing.T) {
	for kind, want := range map[string]bool{
		"exec_approval": true, "slash_confirm": true, "clarify": true,
		"": false, "Clarify": false, "poll": false,
	} {
		if got := protocol.IsPromptKind(kind); got != want {
			t.Errorf("IsPromptKind(%q) = %v, want %v", kind, got, want)
		}
	}
}

func TestClarifyOption(t *testing.T) {
	for i, want := range []string{"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10"} {
		if got := protocol.ClarifyOption(i); got != want {
			t.Errorf("ClarifyOption(%d) = %q, want %q", i, got, want)
		}
	}
}
