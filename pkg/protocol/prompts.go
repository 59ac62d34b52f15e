package protocol

import (
	"fmt"
	"slices"
	"strconv"
)

// Prompt kinds.
const (
	PromptExecApproval = "exec_approval"
	PromptSlashConfirm = "slash_confirm"
	PromptClarify      = "clarify"
)

// Option ids of the option tables.
const (
	OptionOnce    = "once"
	OptionSession = "session"
	OptionAlways  = "always"
	OptionDeny    = "deny"
	OptionCancel  = "cancel"
	OptionOther   = "other"
)

// Option is a button of a card. Style is primary, danger or empty.
type Option struct {
	ID    string `json:"id"`
	Label string `json:"label"`
	Style string `json:"style"`
}

// Prompt is a card with buttons as sent to the app.
type Prompt struct {
	ID             string   `json:"id"`
	Kind           string   `json:"kind"`
	Text           string   `json:"text"`
	Options        []Option `json:"options"`
	Command        string   `json:"command,omitempty"`
	Description    string   `json:"description,omitempty"`
	Session        string   `json:"session"`
	TimeoutSeconds int      `json:"timeout_seconds"`
}

// IsPromptKind reports whether kind is a card kind of the protocol.
func IsPromptKind(kind string) bool {
	return kind == PromptExecApproval || kind == PromptSlashConfirm || kind == PromptClarify
}

// PromptOptions returns the buttons of a card of kind; choices are the
// proposed answers of a clarify card (c0, c1, … in order, then other).
func PromptOptions(kind string, choices []string) []Option {
	switch kind {
	case PromptExecApproval:
		return []Option{
			{OptionOnce, "Allow once", "primary"},
			{OptionSession, "Allow for this session", ""},
			{OptionAlways, "Always allow", ""},
			{OptionDeny, "Deny", "danger"},
		}
	case PromptSlashConfirm:
		return []Option{
			{OptionOnce, "Run once", "primary"},
			{OptionAlways, "Always", ""},
			{OptionCancel, "Cancel", "danger"},
		}
	case PromptClarify:
		opts := make([]Option, 0, len(choices)+1)
		for i, c := range choices {
			opts = append(opts, Option{ClarifyOption(i), c, ""})
		}
		return append(opts, Option{OptionOther, "Other…", ""})
	}
	return nil
}

// ClarifyOption is the option id of the i-th proposed answer: c0, c1, …
func ClarifyOption(i int) string { return "c" + strconv.Itoa(i) }

// SafeOption is what an unanswered or unknown answer of kind resolves to.
func SafeOption(kind string) string {
	switch kind {
	case PromptExecApproval:
		return OptionDeny
	case PromptSlashConfirm:
		return OptionCancel
	}
	return OptionOther
}

// ResolveOption validates an answer against the option table of kind. The
// client is not trusted: any value outside the table becomes the safe option
// (deny, cancel, or other for clarify). An answer without option_id uses its
// text as the option, except for clarify where text is the custom answer.
// nChoices is the number of proposed answers of a clarify card.
func ResolveOption(kind, optionID, text string, nChoices int) string {
	choice := optionID
	if choice == "" && kind != PromptClarify {
		choice = text
	}
	switch kind {
	case PromptExecApproval:
		switch choice {
		case OptionOnce, OptionSession, OptionAlways, OptionDeny:
			return choice
		}
	case PromptSlashConfirm:
		switch choice {
		case OptionOnce, OptionAlways, OptionCancel:
			return choice
		}
	case PromptClarify:
		if i, ok := clarifyIndex(choice); ok && i < nChoices {
			return choice
		}
	}
	return SafeOption(kind)
}

// clarifyIndex parses cN (no sign, no leading zeros).
func clarifyIndex(s string) (int, bool) {
	if len(s) < 2 || s[0] != 'c' || (s[1] == '0' && len(s) > 2) {
		return 0, false
	}
	n := 0
	for _, c := range s[1:] {
		if c < '0' || c > '9' || n > 1<<20 {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// OfferOptions narrows the buttons of an exec_approval or slash_confirm card
// to offer (in the table's order); the safe option stays. An empty offer is
// the whole table; an id outside the table is an error.
func OfferOptions(kind string, offer []string) ([]Option, error) {
	all := PromptOptions(kind, nil)
	if len(offer) == 0 {
		return all, nil
	}
	if kind == PromptClarify {
		return nil, fmt.Errorf("a clarify card takes choices, not options")
	}
	want := make(map[string]bool, len(offer))
	for _, id := range offer {
		if !slices.ContainsFunc(all, func(o Option) bool { return o.ID == id }) {
			return nil, fmt.Errorf("option %q is not one of %s's", Truncate(id, 40), kind)
		}
		want[id] = true
	}
	want[SafeOption(kind)] = true
	return slices.DeleteFunc(all, func(o Option) bool { return !want[o.ID] }), nil
}

// Offered reports whether option is one of the buttons of card: an answer
// the card did not offer becomes the safe option.
func Offered(opts []Option, option string) bool {
	return slices.ContainsFunc(opts, func(o Option) bool { return o.ID == option })
}
