package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/beamdir/beam/agents/wire"
)

// maxResponseBody bounds every directory response the client reads.
const maxResponseBody = 4 << 20

// Agent is an agent record as the directory serves it. The directory may
// answer in snake_case or camelCase; both are accepted.
type Agent struct {
	BeamID       string
	DID          string
	DisplayName  string
	Capabilities []string
	// PublicKey is the agent's active key, base64 SPKI DER.
	PublicKey  string
	Org        string
	TrustScore float64
	Verified   bool
	Visibility string
	// CreatedAt and LastSeen are as the directory formats them.
	CreatedAt string
	LastSeen  string
	// Raw is the complete JSON object the directory returned.
	Raw json.RawMessage
}

// UnmarshalJSON reads an agent record in either naming style.
func (a *Agent) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("agent record: %w", err)
	}
	pick := func(dst any, keys ...string) {
		for _, k := range keys {
			if v, ok := m[k]; ok && string(v) != "null" {
				if json.Unmarshal(v, dst) == nil {
					return
				}
			}
		}
	}
	var out Agent
	pick(&out.BeamID, "beamId", "beam_id")
	pick(&out.DID, "did")
	pick(&out.DisplayName, "displayName", "display_name")
	pick(&out.Capabilities, "capabilities")
	pick(&out.PublicKey, "publicKey", "public_key")
	pick(&out.Org, "org")
	pick(&out.TrustScore, "trustScore", "trust_score")
	pick(&out.Verified, "verified")
	pick(&out.Visibility, "visibility")
	pick(&out.CreatedAt, "createdAt", "created_at")
	pick(&out.LastSeen, "lastSeen", "last_seen")
	out.Raw = append(json.RawMessage(nil), b...)
	*a = out
	return nil
}

// RegisterResult is the answer to Register.
type RegisterResult struct {
	// Agent is the registered record.
	Agent Agent
	// APIKey is the agent's API key ("bk_…"). The directory returns it only
	// when it mints one (first registration); it is empty otherwise.
	APIKey string
	// Created reports a new registration (HTTP 201) as opposed to an
	// idempotent or authenticated re-registration (HTTP 200).
	Created bool
}

// SearchQuery filters Search. Zero fields do not filter.
type SearchQuery struct {
	// Org limits the results to one organisation.
	Org string
	// Capabilities lists capabilities every result must have.
	Capabilities []string
	// Text is a free-text query (the directory's q parameter).
	Text string
	// Limit caps the number of results; 0 means the directory's default.
	Limit int
}

// SearchResult is the answer to Search.
type SearchResult struct {
	Agents []Agent `json:"agents"`
	// Total is the number of matches the directory reports.
	Total int `json:"total"`
}

// Register registers the client's identity with the directory under
// displayName with the given capabilities. When the directory returns an API
// key and the client has none yet, the client adopts it (for Connect); the
// caller persists it (for example in Identity.APIKey, then Identity.Save).
// Re-registering the same key is idempotent; when the client holds an API
// key it is sent as proof, so the record is updated.
func (c *Client) Register(ctx context.Context, displayName string, capabilities []string) (*RegisterResult, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	if capabilities == nil {
		capabilities = []string{}
	}
	body := map[string]any{
		"beamId":       c.id.BeamID,
		"displayName":  displayName,
		"capabilities": capabilities,
		"publicKey":    c.id.PublicKeyBase64(),
	}
	if bid, err := wire.ParseBeamID(c.id.BeamID); err == nil && !bid.Personal() {
		body["org"] = bid.Org
	}
	var raw json.RawMessage
	status, err := c.doJSON(ctx, http.MethodPost, "/agents/register", nil, body, &raw, c.apiKeyValue() != "")
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", c.id.BeamID, err)
	}
	res := &RegisterResult{Created: status == http.StatusCreated}
	if err := json.Unmarshal(raw, &res.Agent); err != nil {
		return nil, fmt.Errorf("register %s: %w", c.id.BeamID, err)
	}
	var key struct {
		APIKey string `json:"apiKey"`
	}
	_ = json.Unmarshal(raw, &key)
	res.APIKey = key.APIKey
	if res.APIKey != "" {
		c.mu.Lock()
		if c.apiKey == "" {
			c.apiKey = res.APIKey
		}
		c.mu.Unlock()
	}
	return res, nil
}

// Lookup fetches one agent by Beam ID. An unknown agent is an *Error with
// Code "NOT_FOUND" and Status 404.
func (c *Client) Lookup(ctx context.Context, beamID string) (*Agent, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	if beamID == "" {
		return nil, errors.New("lookup: empty beam id")
	}
	var a Agent
	if _, err := c.doJSON(ctx, http.MethodGet, "/agents/"+url.PathEscape(beamID), nil, nil, &a, c.apiKeyValue() != ""); err != nil {
		return nil, fmt.Errorf("lookup %s: %w", beamID, err)
	}
	return &a, nil
}

// Search lists the agents that match q.
func (c *Client) Search(ctx context.Context, q SearchQuery) (*SearchResult, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	v := url.Values{}
	if q.Org != "" {
		v.Set("org", q.Org)
	}
	if len(q.Capabilities) > 0 {
		v.Set("capabilities", strings.Join(q.Capabilities, ","))
	}
	if q.Text != "" {
		v.Set("q", q.Text)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var res SearchResult
	if _, err := c.doJSON(ctx, http.MethodGet, "/agents/search", v, nil, &res, false); err != nil {
		return nil, fmt.Errorf("search: %w", err)
	}
	if res.Agents == nil {
		res.Agents = []Agent{}
	}
	return &res, nil
}

// doJSON sends one JSON request to the directory and decodes a 2xx answer
// into out. Anything else becomes an *Error from the {error, errorCode}
// body. It returns the HTTP status.
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, in, out any, withKey bool) (int, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key := c.apiKeyValue(); withKey && key != "" {
		req.Header.Set("x-api-key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read response: %w", err)
	}
	if len(b) > maxResponseBody {
		return resp.StatusCode, fmt.Errorf("response larger than %d bytes", maxResponseBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, ErrorFromResponse(resp, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode response (HTTP %d): %w", resp.StatusCode, err)
		}
	}
	return resp.StatusCode, nil
}
