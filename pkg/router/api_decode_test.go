package router_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// goTerms are what an answer must not show a client: Go's type names and
// the JSON packages' own wording.
var goTerms = regexp.MustCompile(`\bGo\b|json:|jsontext|unmarshal|\b(u?int(8|16|32|64)?|float(32|64)|bool|struct)\b|\[\][a-z]|\b(router|protocol|push)\.`)

// TestAPIBadBodiesSayWhatIsWrong: a body whose JSON is wrong, at every
// endpoint that takes one, is answered 400 bad_frame with a message in the
// API's terms: the member (as a client writes it) and the JSON it takes,
// never a Go type ("cannot unmarshal string into Go float64 within
// "/ttl"" before).
func TestAPIBadBodiesSayWhatIsWrong(t *testing.T) {
	e := startSingle(t, apiConfig(nil))
	const session = "/v1/sessions/mobile:tel-1"
	for _, tc := range []struct {
		method, path, token, body string
		want                      string // in the message
	}{
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","text":"hi","ttl":"60"}`, "ttl must be a number, not a string"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","text":"hi","ttl":1e999}`, "ttl must be a number, not 1e999 (out of range)"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","text":5}`, "text must be a string, not a number"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","media":5}`, "media must be an object, not a number"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","media":{"kind":"image","data":"*not base64*"}}`, "media.data must be a base64 string"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","media":{"kind":"image","data":[1,2]}}`, "media.data must be a base64 string, not an array"},
		{"POST", "/v1/deliver", deliverToken, `[{"target":"tel-1"}]`, "the body must be an object, not an array"},
		{"POST", "/v1/deliver", deliverToken, `{"target":"tel-1","text":"hi"`, "the body is not valid JSON"},
		{"POST", "/v1/deliver", deliverToken, "{\"target\":\"tel-1\",\"text\":\"h\xffi\"}", "the body is not valid JSON: invalid UTF-8 in text"},
		{"POST", "/v1/deliver/batch", deliverToken, `{"deliveries":{"target":"tel-1"}}`, "deliveries must be an array, not an object"},
		{"POST", "/v1/deliver/batch", deliverToken, `"deliveries"`, "the body must be an object, not a string"},
		{"POST", session + "/messages", agentToken, `{"text":"hi","final":"yes"}`, "final must be true or false, not a string"},
		{"POST", session + "/messages", agentToken, `{"text":["hi"]}`, "text must be a string, not an array"},
		{"POST", session + "/media", agentToken, `{"kind":"image","data":5}`, "data must be a base64 string, not a number"},
		{"POST", session + "/media", agentToken, `{"kind":"image","data":"%%%"}`, "data must be a base64 string"},
		{"POST", session + "/prompts", agentToken, `{"kind":"clarify","text":"?","timeout_seconds":1.5}`, "timeout_seconds must be a whole number, not 1.5"},
		{"POST", session + "/prompts", agentToken, `{"kind":"clarify","text":"?","timeout_seconds":1e30}`, "timeout_seconds must be a whole number, not 1e30 (out of range)"},
		{"POST", session + "/prompts", agentToken, `{"kind":"clarify","text":"?","choices":["a",2]}`, "choices[1] must be a string, not a number"},
		{"POST", session + "/typing", agentToken, `{"stop":1}`, "stop must be true or false, not a number"},
		{"POST", session + "/avatar", agentToken, `{"state":null,"x":1} {}`, "the body is not valid JSON"},
		{"POST", session + "/avatar", agentToken, `{"state":{}}`, "state must be a string, not an object"},
		{"PUT", "/v1/devices/tel-1/push", agentToken, `{"kind":"webhook","url":true}`, "url must be a string, not true"},
	} {
		r := e.call(t, tc.method, tc.path, tc.token, tc.body)
		wantError(t, r, http.StatusBadRequest, "bad_frame")
		msg, _ := r.json(t)["message"].(string)
		if !strings.Contains(msg, tc.want) || goTerms.MatchString(msg) {
			t.Errorf("%s %s %s: %q; want %q, and no Go terms", tc.method, tc.path, tc.body, msg, tc.want)
		}
	}

	// A batch answers each delivery as POST /v1/deliver would.
	r := e.call(t, "POST", "/v1/deliver/batch", deliverToken,
		`{"deliveries":[{"target":"tel-1","text":"hi","ttl":"60"},5,{"target":"tel-1","media":{"kind":"image","data":"@"}}]}`)
	if r.status != http.StatusOK {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	var body struct {
		Results []struct {
			Status int `json:"status"`
			Error  struct {
				Error, Message string
			} `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || len(body.Results) != 3 {
		t.Fatalf("batch answered %s (%v)", r.body, err)
	}
	for i, want := range []string{"ttl must be a number, not a string", "a delivery must be an object, not a number", "media.data must be a base64 string"} {
		got := body.Results[i]
		if got.Status != http.StatusBadRequest || got.Error.Error != "bad_frame" || !strings.Contains(got.Error.Message, want) || goTerms.MatchString(got.Error.Message) {
			t.Errorf("delivery %d: %d %s %q; want 400 bad_frame %q, and no Go terms", i, got.Status, got.Error.Error, got.Error.Message, want)
		}
	}
}
