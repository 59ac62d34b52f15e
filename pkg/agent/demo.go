package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Demo is the built-in agent that makes a gateway useful and testable
// without Hermes. Its behaviour is part of the contract (docs/agents.md,
// "The demo agent"):
//
//   - text not starting with "/": a reply "You said: <text>", streamed as a
//     first message, an edit, and a final edit;
//   - "/approve <command>": an exec_approval card for <command>;
//   - "/confirm <title>": a slash_confirm card;
//   - "/clarify <question> | <opt1> | <opt2> …": a clarify card;
//   - an answered or expired card: "<kind> resolved: <option>" (clarify
//     other: "clarify resolved: other: <text>"), or "<kind> expired: <option>";
//   - audio: "Received audio: <n> bytes (<format>)", plus the recognised text;
//   - media: the same bytes sent back with the same kind (voice for audio),
//     mime and filename.
type Demo struct{}

var _ Agent = Demo{}

// Handle implements Agent.
func (Demo) Handle(ctx context.Context, ev wire.Event, out Output) error {
	switch ev.Kind {
	case wire.EventText:
		if strings.HasPrefix(ev.Text, "/") {
			return demoCommand(ctx, ev.Text, out)
		}
		return demoEcho(ctx, ev.Text, out)
	case wire.EventAudio:
		size, format := 0, ev.Format
		if ev.Media != nil {
			size = ev.Media.Size
		}
		text := fmt.Sprintf("Received audio: %d bytes (%s)", size, format)
		if ev.Text != "" {
			text += ". Recognised text: " + ev.Text
		}
		return say(ctx, out, text)
	case wire.EventMedia:
		m := ev.Media
		if m == nil {
			return nil
		}
		kind := m.Kind
		if kind == "audio" {
			kind = "voice"
		}
		return out.Media(ctx, Media{
			ID: ids.New("m"), Kind: kind, Mime: m.Mime, Filename: m.Filename, Caption: m.Caption, Blob: m.Blob, ReplyTo: ev.ID,
		})
	case wire.EventPrompt:
		p := ev.Prompt
		if p == nil {
			return nil
		}
		switch {
		case p.Expired:
			return say(ctx, out, p.Kind+" expired: "+p.Option)
		case p.Option == protocol.OptionOther && p.Text != "":
			return say(ctx, out, p.Kind+" resolved: other: "+p.Text)
		}
		return say(ctx, out, p.Kind+" resolved: "+p.Option)
	}
	return nil
}

// demoEcho streams the reply: a first part, an edit, and the final edit.
func demoEcho(ctx context.Context, text string, out Output) error {
	if err := out.Typing(ctx, false); err != nil {
		return err
	}
	id := ids.New("r")
	const prefix = "You said: "
	half := protocol.Truncate(text, len([]rune(text))/2)
	steps := []struct {
		text        string
		edit, final bool
	}{
		{prefix, false, false},
		{prefix + half, true, false},
		{prefix + text, true, true},
	}
	for _, s := range steps {
		if err := out.Message(ctx, id, s.text, s.edit, s.final); err != nil {
			return err
		}
	}
	return nil
}

func demoCommand(ctx context.Context, text string, out Output) error {
	cmd, arg, _ := strings.Cut(text, " ")
	arg = strings.TrimSpace(arg)
	var p Prompt
	switch strings.ToLower(cmd) {
	case "/approve":
		p = Prompt{Kind: protocol.PromptExecApproval, Text: "Run this command?", Command: arg,
			Description: "The demo agent asks before it runs a command."}
	case "/confirm":
		p = Prompt{Kind: protocol.PromptSlashConfirm, Text: arg}
	case "/clarify":
		fields := strings.Split(arg, "|")
		p = Prompt{Kind: protocol.PromptClarify, Text: strings.TrimSpace(fields[0])}
		for _, f := range fields[1:] {
			if f = strings.TrimSpace(f); f != "" {
				p.Choices = append(p.Choices, f)
			}
		}
	default:
		return say(ctx, out, "Unknown command "+cmd+". Try /approve <command>, /confirm <title> or /clarify <question> | <option> | <option>.")
	}
	if arg == "" {
		return say(ctx, out, "Usage: "+cmd+" needs an argument.")
	}
	_, err := out.Prompt(ctx, p)
	return err
}

// say sends one final message.
func say(ctx context.Context, out Output, text string) error {
	return out.Message(ctx, ids.New("r"), text, false, true)
}
