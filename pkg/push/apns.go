package push

// The Apple Push Notification service's provider API with token-based
// authentication: one HTTP/2 POST per notification to
// <host>/3/device/<device token>, its headers authorization: bearer <a JWT
// signed ES256 by the team's .p8 key>, apns-topic, apns-push-type,
// apns-priority, apns-expiration and apns-collapse-id. The API as
// github.com/sideshow/apns2 v0.25.0 implements and documents it (client.go
// for the hosts, the path and the headers; notification.go for their
// meaning; response.go for the answers' reasons; token/token.go for the
// provider token, renewed before the hour APNs takes it for).
//
// apns2 makes the provider token (token) and the payload (payload); the
// request itself is built here rather than by apns2.Client, whose Push
// answers with the status and reason but not the headers (a Retry-After
// would be lost) and dials on its own transport: here it goes through the
// Notifier's, the address policy's dialer, with its slots and retries,
// over HTTP/2 as APNs requires (the transport negotiates h2 by ALPN).

import (
	"bytes"
	"context"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/payload"
	"github.com/sideshow/apns2/token"
)

// APNs environments: where a token of an app built for development
// (sandbox) or the App Store and TestFlight (production) is sent.
const (
	APNsProduction = "production"
	APNsSandbox    = "sandbox"
)

// APNsConfig configures the Apple Push Notification service.
type APNsConfig struct {
	// Key is the team's APNs authentication key, the .p8 file the Apple
	// Developer account hands out (Certificates, Identifiers & Profiles,
	// Keys): a P-256 private key in PEM.
	Key []byte
	// KeyID is the key's 10-character id; TeamID the developer team's.
	KeyID  string
	TeamID string
	// Topic is the app's bundle id (apns-topic).
	Topic string
	// Environment is APNsProduction (the default) or APNsSandbox: an
	// app built from Xcode has sandbox tokens, which production refuses
	// as BadDeviceToken (and the other way round).
	Environment string
	// URL replaces the environment's host (https only: APNs is HTTP/2
	// over TLS); a test's stand-in. The Policy judges its address.
	URL string
}

// APNs is an APNsConfig that LoadAPNs checked.
type APNs struct {
	cfg    APNsConfig
	key    *token.Token // a template: each sender signs with its own
	host   string
	origin string
}

// LoadAPNs checks c: a .p8 key that parses as a P-256 key, ids, a topic,
// an environment. Its errors never quote the key.
func LoadAPNs(c APNsConfig) (*APNs, error) {
	key, err := token.AuthKeyFromBytes(c.Key)
	switch {
	case errors.Is(err, token.ErrAuthKeyNotPem):
		return nil, errors.New("the APNs key is not a .p8 file (PEM)")
	case errors.Is(err, token.ErrAuthKeyNotECDSA):
		return nil, errors.New("the APNs key is not an elliptic-curve key: use the .p8 of an APNs key")
	case err != nil:
		return nil, errors.New("the APNs key does not parse as a PKCS #8 private key: use the .p8 of an APNs key")
	case key.Curve != elliptic.P256():
		return nil, errors.New("the APNs key is not a P-256 key: use the .p8 of an APNs key")
	}
	for name, v := range map[string]string{"key id": c.KeyID, "team id": c.TeamID, "topic": c.Topic} {
		if v == "" {
			return nil, fmt.Errorf("the APNs %s is missing", name)
		}
		if strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return nil, fmt.Errorf("the APNs %s %q has a space, a control character or a non-ASCII one", name, v)
		}
	}
	host := apns2.HostProduction
	switch c.Environment {
	case "", APNsProduction:
	case APNsSandbox, "development":
		host = apns2.HostDevelopment
	default:
		return nil, fmt.Errorf("APNs environment %q: production or sandbox", c.Environment)
	}
	if c.URL != "" {
		host = strings.TrimSuffix(c.URL, "/")
		if u, err := url.Parse(host); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
			return nil, fmt.Errorf("APNs's url %q is not an absolute https URL without credentials: APNs is HTTP/2 over TLS", c.URL)
		}
	}
	t := &token.Token{AuthKey: key, KeyID: c.KeyID, TeamID: c.TeamID}
	if _, err := t.Generate(); err != nil {
		return nil, fmt.Errorf("signing an APNs provider token with the key: %w", err)
	}
	u, _ := url.Parse(host)
	return &APNs{cfg: c, key: t, host: host, origin: origin(u)}, nil
}

// Host is where notifications go: the environment's APNs host, or URL.
func (a *APNs) Host() string { return a.host }

// apnsSender sends APNs's notifications for a Notifier.
type apnsSender struct {
	a   *APNs
	ttl time.Duration
	tok *token.Token // renewed after token.TokenTimeout (50 min) or when APNs finds it expired
}

func newAPNsSender(a *APNs, n *Notifier) *apnsSender {
	return &apnsSender{a: a, ttl: n.cfg.TTL, tok: &token.Token{AuthKey: a.key.AuthKey, KeyID: a.key.KeyID, TeamID: a.key.TeamID}}
}

func (s *apnsSender) endpoint() string { return s.a.origin }

func (s *apnsSender) request(ctx context.Context, devToken string, nt Notice) (*http.Request, outcome) {
	bearer := s.tok.GenerateIfExpired()
	if bearer == "" {
		return nil, outcome{err: errors.New("no APNs provider token could be signed"), permanent: true}
	}
	p := payload.NewPayload().AlertTitle(alertTitle).AlertBody(alert(nt)).Sound("default").ThreadID(collapseKey).
		Custom("device", nt.public().Device).Custom("what", nt.What)
	body, _ := json.Marshal(p)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.a.host+"/3/device/"+devToken, bytes.NewReader(body))
	if err != nil {
		return nil, outcome{err: errors.New("APNs's url cannot be requested"), permanent: true}
	}
	h := req.Header
	h.Set("authorization", "bearer "+bearer)
	h.Set("apns-topic", s.a.cfg.Topic)
	h.Set("apns-push-type", string(apns2.PushTypeAlert))
	h.Set("apns-priority", strconv.Itoa(apns2.PriorityHigh))
	h.Set("apns-expiration", strconv.FormatInt(nt.At.Add(s.ttl).Unix(), 10))
	h.Set("apns-collapse-id", collapseKey)
	h.Set("content-type", "application/json")
	return req, outcome{}
}

// answer: 410 (Unregistered, ExpiredToken) and 400 BadDeviceToken are a
// dead token (the app is gone, or the token is another environment's); a
// 403 ExpiredProviderToken has the provider token signed again for the
// retry.
func (s *apnsSender) answer(resp *http.Response, body []byte, o outcome) outcome {
	var r struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(body, &r)
	if r.Reason != "" {
		o.err = fmt.Errorf("%w (%s)", o.err, r.Reason)
	}
	switch {
	case resp.StatusCode == http.StatusGone,
		resp.StatusCode == http.StatusBadRequest && r.Reason == apns2.ReasonBadDeviceToken:
		o.dead, o.permanent = true, true
	case resp.StatusCode == http.StatusForbidden && r.Reason == apns2.ReasonExpiredProviderToken:
		s.tok.Lock()
		s.tok.IssuedAt = 0 // signed again on the next request
		s.tok.Unlock()
		o.permanent = false
	}
	return o
}
