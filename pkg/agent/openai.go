package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/ids"
	"github.com/hermes-mobile/gateway/pkg/store"
	"github.com/hermes-mobile/gateway/pkg/wire"
)

// Defaults of OpenAIConfig.
const (
	DefaultOpenAIBaseURL     = "https://api.openai.com/v1"
	DefaultOpenAITimeout     = 120 * time.Second
	DefaultOpenAIFirstByte   = 60 * time.Second
	DefaultOpenAIEditEvery   = 250 * time.Millisecond
	DefaultOpenAITypingEvery = 10 * time.Second
	DefaultOpenAIMaxAnswer   = 32 << 10
	DefaultOpenAIMaxLine     = 64 << 10
	DefaultOpenAIMaxImage    = 4 << 20
	DefaultOpenAIHistoryLen  = 40
	DefaultOpenAIHistorySize = 64 << 10
	DefaultOpenAIHistoryTTL  = 7 * 24 * time.Hour
)

// OpenAIConfig configures the OpenAI agent. Zero durations and sizes mean
// their defaults.
type OpenAIConfig struct {
	// BaseURL is the API root; the agent posts to BaseURL + "/chat/completions"
	// (DefaultOpenAIBaseURL).
	BaseURL string
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Model is the model name; required.
	Model string
	// SystemPrompt, when set, is the first message of every request.
	SystemPrompt string
	// Timeout bounds one request, from sending it to the end of the stream
	// (120 s).
	Timeout time.Duration
	// FirstByte bounds the wait for the first line of the stream (60 s).
	FirstByte time.Duration
	// EditEvery is the least time between two edits of the streamed message
	// (250 ms: at most 4 edits per second); deltas that arrive meanwhile are
	// sent together.
	EditEvery time.Duration
	// TypingEvery is how often typing is repeated while waiting for the first
	// delta, so the avatar stays thinking (10 s).
	TypingEvery time.Duration
	// MaxAnswer bounds the answer in bytes (32 KiB); a longer one is cut.
	MaxAnswer int
	// MaxLine bounds one line of the stream in bytes (64 KiB).
	MaxLine int
	// MaxImage bounds an image passed on as a data URL, in bytes before
	// base64 (4 MiB); a larger one is described in words.
	MaxImage int
	// HistoryLen and HistorySize bound a session's history in messages (40)
	// and bytes (64 KiB); HistoryTTL is how long it outlives its last turn
	// (7 days).
	HistoryLen  int
	HistorySize int
	HistoryTTL  time.Duration
	// Client sends the requests (http.DefaultClient).
	Client *http.Client
	// Log receives a warning for every failed answer (discarded when nil).
	Log *slog.Logger
	// Meter receives the upstream's calls, results and latency
	// (hermes_agent_upstream_*); nil records nothing.
	Meter metric.Meter
}

// Check reports a configuration the agent cannot work with: no model, or a
// base URL that is not http(s).
func (c OpenAIConfig) Check() error {
	if strings.TrimSpace(c.Model) == "" {
		return errors.New("no model")
	}
	if c.BaseURL == "" {
		return nil
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("base URL %q is not an http(s) URL", c.BaseURL)
	}
	return nil
}

// OpenAI is the agent of AGENT=openai: it sends each device conversation to
// an OpenAI-compatible /chat/completions endpoint (OpenAI, Hermes's own API
// server, vLLM, Ollama, …) with stream: true, and streams the answer to the
// device: typing while it waits (avatar thinking), the first delta as a
// message, further deltas as edits at most every EditEvery, a final edit
// with the whole text, then typing stop (avatar idle).
//
// Text is passed on as it is; audio as its recognised text; an image as a
// data URL content part; other files as a short note. Card answers are
// ignored: this agent opens no cards.
//
// Each session's conversation is kept in the store (store.History), bounded
// by HistoryLen and HistorySize, so any router node continues it. A turn is
// recorded once its answer is complete (or cut at MaxAnswer); a failed turn
// is not recorded.
//
// Every failure (an upstream error status, a timeout, a malformed or
// oversized stream) ends in a final message saying so, then typing stop:
// the device is never left with a thinking avatar.
type OpenAI struct {
	cfg      OpenAIConfig
	endpoint string
	history  store.History
	log      *slog.Logger
	m        *openaiMetrics
}

var _ Agent = (*OpenAI)(nil)

// NewOpenAI returns the agent for cfg, keeping histories in h.
func NewOpenAI(cfg OpenAIConfig, h store.History) (*OpenAI, error) {
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultOpenAIBaseURL
	}
	setDefault(&cfg.Timeout, DefaultOpenAITimeout)
	setDefault(&cfg.FirstByte, DefaultOpenAIFirstByte)
	setDefault(&cfg.EditEvery, DefaultOpenAIEditEvery)
	setDefault(&cfg.TypingEvery, DefaultOpenAITypingEvery)
	setDefault(&cfg.MaxAnswer, DefaultOpenAIMaxAnswer)
	setDefault(&cfg.MaxLine, DefaultOpenAIMaxLine)
	setDefault(&cfg.MaxImage, DefaultOpenAIMaxImage)
	setDefault(&cfg.HistoryLen, DefaultOpenAIHistoryLen)
	setDefault(&cfg.HistorySize, DefaultOpenAIHistorySize)
	setDefault(&cfg.HistoryTTL, DefaultOpenAIHistoryTTL)
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &OpenAI{
		cfg:      cfg,
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions",
		history:  h,
		log:      log,
		m:        newOpenAIMetrics(cfg.Meter),
	}, nil
}

func setDefault[T int | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

// Handle answers one event.
func (o *OpenAI) Handle(ctx context.Context, ev wire.Event, out Output) error {
	switch ev.Kind {
	case wire.EventText, wire.EventAudio, wire.EventMedia:
	default:
		return nil
	}
	if err := out.Typing(ctx, false); err != nil {
		return err
	}
	id := ids.New("r")
	user, record, err := o.userMessage(ctx, ev, out)
	if err != nil {
		return o.fail(ctx, out, id, answer{}, err)
	}
	a, err := o.stream(ctx, o.request(ctx, ev.Session, user), id, out)
	if err != nil {
		return o.fail(ctx, out, id, a, err)
	}
	text := a.text
	switch {
	case a.cut:
		text += fmt.Sprintf("\n\n[The answer was cut: it is longer than %d bytes.]", o.cfg.MaxAnswer)
	case text == "":
		text = "The agent gave an empty answer."
	}
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	if err := out.Message(sctx, id, text, a.started, true); err != nil {
		return err
	}
	if err := out.Typing(sctx, true); err != nil {
		return err
	}
	return o.remember(sctx, ev.Session, record, chatMessage{Role: "assistant", Content: text})
}

// fail tells the device why there is no complete answer, in the final
// frame of message id, and stops typing.
func (o *OpenAI) fail(ctx context.Context, out Output, id string, a answer, cause error) error {
	o.log.WarnContext(ctx, "the agent could not answer", "err", cause)
	sctx, cancel := settleCtx(ctx)
	defer cancel()
	text := "The agent could not answer: " + describe(cause) + "."
	if a.started {
		text = a.text + "\n\n[The agent could not finish: " + describe(cause) + ".]"
	}
	err := out.Message(sctx, id, text, a.started, true)
	return errors.Join(err, out.Typing(sctx, true))
}

// settleCtx is for the last words of a turn: they are sent even when ctx
// ended (the per-event timeout, a shutdown), within a few seconds.
func settleCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}
