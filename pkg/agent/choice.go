package agent

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/hermes-mobile/gateway/pkg/config"
	"github.com/hermes-mobile/gateway/pkg/secret"
	"github.com/hermes-mobile/gateway/pkg/store"
)

// Choice is the agent a router runs and its settings, as both services take
// them from flags and the environment (AGENT, OPENAI_*).
type Choice struct {
	Name                                     string // demo, openai or link
	OpenAIBaseURL, OpenAIModel, OpenAIPrompt string
	OpenAIKey                                secret.Secret
	OpenAITimeout                            time.Duration
}

// Register registers AGENT (described by usage) and the OPENAI_* settings.
func (c *Choice) Register(fs *flag.FlagSet, usage string) {
	config.String(fs, &c.Name, "agent", "AGENT", "demo", usage)
	config.String(fs, &c.OpenAIBaseURL, "openai-base-url", "OPENAI_BASE_URL", DefaultOpenAIBaseURL, "AGENT=openai: the API root (…/v1)")
	config.Secret(fs, &c.OpenAIKey, "openai-api-key", "OPENAI_API_KEY", "AGENT=openai: the API key, sent as a bearer token")
	config.String(fs, &c.OpenAIModel, "openai-model", "OPENAI_MODEL", "", "AGENT=openai: the model (required)")
	config.String(fs, &c.OpenAIPrompt, "openai-system-prompt", "OPENAI_SYSTEM_PROMPT", "", "AGENT=openai: the system prompt")
	config.Seconds(fs, &c.OpenAITimeout, "openai-timeout", "OPENAI_TIMEOUT", DefaultOpenAITimeout, "AGENT=openai: bound on one answer")
}

// Resolve checks the choice. It returns the agent's name (demo when empty)
// and, for openai, its configuration; an error names the setting at fault.
func (c Choice) Resolve() (name string, oc OpenAIConfig, err error) {
	switch name = strings.ToLower(strings.TrimSpace(c.Name)); name {
	case "", "demo":
		return "demo", oc, nil
	case "link":
		return name, oc, nil
	case "openai":
	default:
		return "", oc, fmt.Errorf("AGENT: %q is not demo, openai or link", c.Name)
	}
	oc = OpenAIConfig{BaseURL: c.OpenAIBaseURL, APIKey: string(c.OpenAIKey), Model: strings.TrimSpace(c.OpenAIModel),
		SystemPrompt: c.OpenAIPrompt, Timeout: c.OpenAITimeout}
	if oc.Model == "" {
		return "", oc, errors.New("AGENT=openai needs OPENAI_MODEL (or -openai-model): the model to ask")
	}
	if err := oc.Check(); err != nil {
		return "", oc, fmt.Errorf("OPENAI_BASE_URL: %w", err)
	}
	return name, oc, nil
}

// Factory makes a router's agent once the node's store is up; the agent
// records its metrics on m (nil: none).
type Factory func(st store.Store, log *slog.Logger, m metric.Meter) (Agent, error)

// Named is the factory of the agent name, as Resolve returns it: demo,
// link (keeping eventsMax events; 0: DefaultLinkMaxLen) or openai with oc
// (whose Log and Meter, when nil, are the factory's). Both services make
// their agent here.
func Named(name string, oc OpenAIConfig, eventsMax int) Factory {
	return func(st store.Store, log *slog.Logger, m metric.Meter) (Agent, error) {
		switch name {
		case "", "demo":
			return Demo{}, nil
		case "link":
			return NewLink(st, eventsMax), nil
		case "openai":
			if oc.Log == nil {
				oc.Log = log.With("component", "openai")
			}
			if oc.Meter == nil {
				oc.Meter = m
			}
			return NewOpenAI(oc, st)
		}
		return nil, fmt.Errorf("AGENT: %q is not demo, openai or link", name)
	}
}
