package router

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hermes-mobile/gateway/pkg/admin"
	"github.com/hermes-mobile/gateway/pkg/agent"
	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/protocol"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Bounds of what an outside agent may send, beyond the protocol's.
const (
	// MaxAgentTextChars bounds one message of the agent. The edge cuts it
	// into 3,500-character frames; the bound keeps an outbox of 256 of them
	// within memory.
	MaxAgentTextChars = 100_000
	// MaxPromptChoices bounds the proposed answers of a clarify card.
	MaxPromptChoices = 32
)

// The endpoints under /v1/sessions/{session}/ speak as the agent to one
// device, through the router's agent.Output: an offline device gets the
// output in its outbox (typing and avatar states excepted), as with the
// built-in agents. They answer 200 once the frames are written to the
// device's socket or kept in its outbox.

// sessionDevice returns the device key of the path's {session}
// (mobile:<device> or <device>): the device of the caller's owner.
func sessionDevice(req *http.Request) (string, error) {
	dev := strings.TrimPrefix(req.PathValue("session"), protocol.SessionPrefix)
	if dev == "" {
		return "", badFrame("the session must be mobile:<device> or <device>")
	}
	return deviceKey(req, dev)
}

type messageRequest struct {
	ID    string `json:"id"`
	Text  string `json:"text"`
	Edit  bool   `json:"edit"`
	Final *bool  `json:"final"` // true when absent
}

// postMessage is POST /v1/sessions/{session}/messages: a message, or with
// edit the complete new text of the message id (streaming); final marks
// the last part.
func (a *API) postMessage(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	var body messageRequest
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	if body.Text == "" {
		return badFrame("a message needs text")
	}
	if err := checkText("text", body.Text, MaxAgentTextChars); err != nil {
		return err
	}
	id := protocol.Truncate(body.ID, protocol.MaxIDChars)
	if id == "" {
		if body.Edit {
			return badFrame("an edit needs the id of the message it replaces")
		}
		id = ids.New("r")
	}
	final := body.Final == nil || *body.Final
	if err := a.r.Output(dev).Message(req.Context(), id, body.Text, body.Edit, final); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true, ID: id})
	return nil
}

type mediaRequest struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Mime     string `json:"mime"`
	Filename string `json:"filename"`
	Caption  string `json:"caption"`
	Data     []byte `json:"data"` // base64 in the JSON
	Blob     string `json:"blob"` // or a file in the store (an upload's media.blob)
	URL      string `json:"url"`  // or a link the app downloads itself
	ReplyTo  string `json:"reply_to"`
}

// postMedia is POST /v1/sessions/{session}/media: a file, given as data,
// as the key of a blob in the store, or as a URL.
func (a *API) postMedia(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	var body mediaRequest
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	if body.Kind == "" {
		return badFrame("media needs a kind")
	}
	kind := strings.ToLower(body.Kind)
	if !protocol.IsMediaOut(kind) {
		return unsupported("media kind must be image, voice, video, document or animation")
	}
	if len(body.Data) == 0 && body.Blob == "" && body.URL == "" {
		return badFrame("media needs data, blob or url")
	}
	if len(body.Data) > protocol.MaxMediaBytes {
		return tooBig("media file is larger than %s", protocol.MiB(protocol.MaxMediaBytes))
	}
	if err := checkText("caption", body.Caption, protocol.MaxTextChars); err != nil {
		return err
	}
	if body.URL != "" {
		u, err := url.Parse(body.URL)
		if err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
			return badFrame("url must be an absolute http or https URL")
		}
	}
	if len(body.Data) == 0 && body.Blob != "" {
		// The edge fetches the blob when it writes the file: check now, or
		// a gone blob would fail there and wait in the outbox. Another
		// owner's blob is as gone as one that expired.
		if store.BlobSpace(body.Blob) != ownerOf(req) {
			return badFrame("blob %q is gone (files are kept for a limited time)", body.Blob)
		}
		if _, err := a.r.store.GetBlob(req.Context(), body.Blob); errors.Is(err, store.ErrNotFound) {
			return badFrame("blob %q is gone (files are kept for a limited time)", body.Blob)
		} else if err != nil {
			return err
		}
	}
	id := protocol.Truncate(body.ID, protocol.MaxIDChars)
	if id == "" {
		id = ids.New("m")
	}
	m := agent.Media{
		ID: id, Kind: kind, Mime: body.Mime, Filename: protocol.Truncate(body.Filename, protocol.MaxFilenameChars),
		Caption: body.Caption, Data: body.Data, URL: body.URL, ReplyTo: protocol.Truncate(body.ReplyTo, protocol.MaxIDChars),
	}
	if len(m.Data) == 0 {
		m.Blob = body.Blob
	}
	if err := a.r.Output(dev).Media(req.Context(), m); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true, ID: id})
	return nil
}

type promptRequest struct {
	Kind        string   `json:"kind"`
	Text        string   `json:"text"`
	Command     string   `json:"command"`
	Description string   `json:"description"`
	Choices     []string `json:"choices"`
	Options     []string `json:"options"`
	// TTL is the card's lifetime in seconds, 1 to MOBILE_PROMPT_MAX_TTL;
	// 0 (or absent) is MOBILE_PROMPT_TTL, and -1 the longest,
	// MOBILE_PROMPT_MAX_TTL: a card for a wait without a limit lives
	// until answered or closed, at most that long.
	TTL int `json:"ttl"`
	// TimeoutSeconds shortens the card's lifetime, never lengthens it (an
	// older agent's way to ask for less than MOBILE_PROMPT_TTL).
	TimeoutSeconds int `json:"timeout_seconds"`
}

// lifetime is how long the card body asks for lives, within the router's
// bound (MOBILE_PROMPT_MAX_TTL), or a bad_frame error saying the bound.
func (body promptRequest) lifetime(cfg Config) (time.Duration, error) {
	maxSeconds := int(cfg.PromptMaxTTL / time.Second)
	life := cfg.PromptTTL
	switch {
	case body.TTL == -1:
		life = cfg.PromptMaxTTL
	case body.TTL < -1 || body.TTL > maxSeconds:
		return 0, badFrame("ttl must be 1 to %d seconds (MOBILE_PROMPT_MAX_TTL), 0 for MOBILE_PROMPT_TTL or -1 for the longest", maxSeconds)
	case body.TTL > 0:
		life = time.Duration(body.TTL) * time.Second
	}
	if body.TimeoutSeconds < 0 {
		return 0, badFrame("timeout_seconds must not be negative")
	}
	if body.TimeoutSeconds > 0 {
		life = min(life, time.Duration(min(body.TimeoutSeconds, 1<<30))*time.Second)
	}
	return life, nil
}

// postPrompt is POST /v1/sessions/{session}/prompts: a card. Its answer,
// or its expiry, arrives as a "prompt" event.
func (a *API) postPrompt(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	var body promptRequest
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	if !protocol.IsPromptKind(body.Kind) {
		return badFrame("kind must be exec_approval, slash_confirm or clarify")
	}
	if body.Text == "" {
		return badFrame("a card needs text")
	}
	for _, f := range []struct{ name, s string }{{"text", body.Text}, {"command", body.Command}, {"description", body.Description}} {
		if err := checkText(f.name, f.s, protocol.MaxTextChars); err != nil {
			return err
		}
	}
	if len(body.Choices) > MaxPromptChoices {
		return tooBig("a card has at most %d choices", MaxPromptChoices)
	}
	for _, c := range body.Choices {
		if c == "" {
			return badFrame("a choice is empty")
		}
		if err := checkText("a choice", c, protocol.MaxTextChars); err != nil {
			return err
		}
	}
	ttl, err := body.lifetime(a.r.cfg)
	if err != nil {
		return err
	}
	if len(body.Options) > 0 {
		if _, err := protocol.OfferOptions(body.Kind, body.Options); err != nil {
			return badFrame("%s", err.Error())
		}
	}
	id, err := a.r.Output(dev).Prompt(req.Context(), agent.Prompt{
		Kind: body.Kind, Text: body.Text, Command: body.Command, Description: body.Description, Choices: body.Choices,
		Options: body.Options, TTL: ttl,
	})
	if err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true, ID: id})
	return nil
}

// deletePrompt is DELETE /v1/sessions/{session}/prompts/{id}: the agent no
// longer waits for the card; the phone's card closes as expired.
func (a *API) deletePrompt(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	id := req.PathValue("id")
	if id == "" || len(id) > protocol.MaxIDChars {
		return badFrame("a card id is 1 to %d characters", protocol.MaxIDChars)
	}
	err = a.r.Output(dev).(*output).ClosePrompt(req.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return apiErr(http.StatusNotFound, codeNotFound, "no such open card: answered, expired or closed already")
	}
	if err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true, ID: id})
	return nil
}

// postTyping is POST /v1/sessions/{session}/typing: the agent is working
// (avatar thinking), or with stop it is done (avatar idle at once).
func (a *API) postTyping(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	var body struct {
		Stop bool `json:"stop"`
	}
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	if err := a.r.Output(dev).Typing(req.Context(), body.Stop); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true})
	return nil
}

// postAvatar is POST /v1/sessions/{session}/avatar: sets the avatar state.
func (a *API) postAvatar(w http.ResponseWriter, req *http.Request) error {
	dev, err := sessionDevice(req)
	if err != nil {
		return err
	}
	var body struct {
		State string `json:"state"`
	}
	if err := a.decode(w, req, &body); err != nil {
		return err
	}
	switch body.State {
	case protocol.AvatarIdle, protocol.AvatarThinking, protocol.AvatarSpeaking:
	default:
		return badFrame("state must be idle, thinking or speaking")
	}
	if err := a.r.Output(dev).Avatar(req.Context(), body.State); err != nil {
		return err
	}
	admin.WriteJSON(w, http.StatusOK, okBody{OK: true})
	return nil
}
