package bench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
)

// maxResponse bounds an HTTP response body bench reads.
const maxResponse = 1 << 20

// agent is one registered agent with its own key.
type agent struct {
	// BeamID is the agent's Beam ID.
	BeamID string
	// Public and Private are its Ed25519 keys.
	Public  ed25519.PublicKey
	Private ed25519.PrivateKey
	// APIKey is the key the directory returned at registration.
	APIKey string
	// Base is the base URL of the directory (or cluster node) the agent
	// registered with; its sessions and HTTP sends go there.
	Base string
	// Pending says the directory made the agent a pending member of its
	// org (a directory without --open-orgs, for every registrant but the
	// org's first).
	Pending bool
}

// call makes one request of the directory at addr and returns the answer's
// status and body, read up to maxResponse. A non-nil body is sent as JSON;
// header, when not nil, is added to the request. An answer whose status is
// not one of ok is returned as the directory's *agents.Error.
func call(ctx context.Context, hc *http.Client, method, addr string, body []byte, header http.Header, ok ...int) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, addr, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("send: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return 0, nil, fmt.Errorf("read response: %w", err)
	}
	if !slices.Contains(ok, resp.StatusCode) {
		return resp.StatusCode, b, agents.ErrorFromResponse(resp, b)
	}
	return resp.StatusCode, b, nil
}

// register creates a key pair for beamID and registers it with the
// directory at base.
func register(ctx context.Context, hc *http.Client, base, beamID, org string) (*agent, error) {
	pub, priv, err := wire.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", beamID, err)
	}
	body, err := json.Marshal(map[string]any{
		"beamId":       beamID,
		"displayName":  "bench " + strings.SplitN(beamID, "@", 2)[0],
		"capabilities": []string{"bench.echo"},
		"publicKey":    wire.EncodePublicKey(pub),
		"org":          org,
	})
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", beamID, err)
	}
	_, b, err := call(ctx, hc, http.MethodPost, base+"/agents/register", body, nil, http.StatusCreated, http.StatusOK)
	if err != nil {
		return nil, fmt.Errorf("register %s: %w", beamID, err)
	}
	var v struct {
		APIKey        string `json:"apiKey"`
		OrgMembership string `json:"orgMembership"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.APIKey == "" {
		return nil, fmt.Errorf("register %s: response carries no apiKey: %.200s", beamID, b)
	}
	return &agent{BeamID: beamID, Public: pub, Private: priv, APIKey: v.APIKey, Base: base, Pending: v.OrgMembership == "pending"}, nil
}

// registerMany registers n agents named prefix-<i>@org with at most
// parallel registrations in flight; agent i registers with
// bases[i%len(bases)], so a cluster's agents spread over its nodes.
func registerMany(ctx context.Context, hc *http.Client, bases []string, org, prefix string, n, parallel int) ([]*agent, error) {
	if len(bases) == 0 {
		return nil, errors.New("register agents: no directory URL")
	}
	out := make([]*agent, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	next := make(chan int)
	for range max(1, min(parallel, n)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				a, err := register(ctx, hc, bases[i%len(bases)], fmt.Sprintf("%s-%d@%s.%s", prefix, i, org, wire.BeamDomain), org)
				if err != nil {
					errOnce.Do(func() { first = err; cancel() })
					continue
				}
				out[i] = a
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("register agents: %w", err)
	}
	return out, nil
}

// wsEnvelope is a message on an agent's WebSocket, both directions.
type wsEnvelope struct {
	Type            string          `json:"type"`
	Frame           json.RawMessage `json:"frame,omitempty"`
	SenderPublicKey string          `json:"senderPublicKey,omitempty"`
	Nonce           string          `json:"nonce,omitempty"`
	ErrorCode       string          `json:"errorCode,omitempty"`
	Message         string          `json:"message,omitempty"`
	// Attestation marks a frame its sender did not sign (a bus or pipeline
	// delivery), signed by the directory's attestation key instead.
	Attestation *wire.Attestation `json:"attestation,omitempty"`
}

// wsURL turns the directory's base URL into its WebSocket URL for a.
func wsURL(base string, a *agent) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("directory url %q: %w", base, err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("directory url %q: want http or https", base)
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/ws"
	u.RawQuery = url.Values{"beamId": {a.BeamID}, "apiKey": {a.APIKey}}.Encode()
	return u.String(), nil
}

// dial opens a's WebSocket session with its API key and waits for the
// directory's "connected" message.
func dial(ctx context.Context, hc *http.Client, base string, a *agent) (*websocket.Conn, error) {
	u, err := wsURL(base, a)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", a.BeamID, err)
	}
	conn.SetReadLimit(maxResponse)
	_, data, err := conn.Read(ctx)
	if err != nil {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("connect %s: waiting for connected: %w", a.BeamID, err)
	}
	var env wsEnvelope
	if json.Unmarshal(data, &env) != nil || env.Type != "connected" {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("connect %s: unexpected first message %.200q", a.BeamID, data)
	}
	return conn, nil
}

// writeEnvelope writes {"type":typ,"frame":frame} keeping frame's bytes.
func writeEnvelope(ctx context.Context, conn *websocket.Conn, typ string, frame []byte) error {
	b := make([]byte, 0, len(frame)+len(typ)+22)
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","frame":`...)
	b = append(b, frame...)
	b = append(b, '}')
	return conn.Write(ctx, websocket.MessageText, b)
}

// fleet is the set of agents of one run: senders, recipients (which answer
// every intent) and idle agents.
type fleet struct {
	// Org is the organization every agent of the run belongs to.
	Org string
	// Senders send the intents; Recipients answer them.
	Senders, Recipients []*agent

	base string
	hc   *http.Client
	keys map[string]ed25519.PublicKey
	// attestKeys are the recipients' directory's published attestation
	// keys by key id (GET /.well-known/beam-attestation).
	attestKeys map[string]ed25519.PublicKey

	mu    sync.Mutex
	conns []*websocket.Conn
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc
	idle  int
	rxErr int64
}

// Key returns the public key of an agent of the fleet.
func (f *fleet) Key(beamID string) (ed25519.PublicKey, bool) {
	k, ok := f.keys[beamID]
	return k, ok
}

// track remembers conn so Close closes it.
func (f *fleet) track(conn *websocket.Conn) {
	f.mu.Lock()
	f.conns = append(f.conns, conn)
	f.mu.Unlock()
}

// Close closes every connection of the fleet and waits for its readers.
func (f *fleet) Close() {
	f.stop()
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.Close(websocket.StatusNormalClosure, "bench done")
	}
	f.wg.Wait()
}

// IdleConnected returns how many idle agents are connected.
func (f *fleet) IdleConnected() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.idle
}

// RecipientErrors returns how many delivered intents a recipient could not
// verify or answer.
func (f *fleet) RecipientErrors() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rxErr
}

// serveRecipient reads a's session and answers every intent with a signed
// success result after verifying the intent's signature against the key
// the fleet registered for its sender.
func (f *fleet) serveRecipient(conn *websocket.Conn, a *agent, clock func() time.Time) {
	defer f.wg.Done()
	for {
		_, data, err := conn.Read(f.ctx)
		if err != nil {
			return
		}
		var env wsEnvelope
		if err := json.Unmarshal(data, &env); err != nil || env.Type != "intent" {
			continue
		}
		if err := f.answer(f.ctx, conn, a, env, clock); err != nil {
			f.mu.Lock()
			f.rxErr++
			f.mu.Unlock()
		}
	}
}

// resultPayload is what a recipient answers with.
var resultPayload = json.RawMessage(`{"ok":true}`)

func (f *fleet) answer(ctx context.Context, conn *websocket.Conn, a *agent, env wsEnvelope, clock func() time.Time) error {
	fr, err := wire.DecodeIntentFrame(env.Frame)
	if err != nil {
		return err
	}
	if fr.To != a.BeamID {
		return fmt.Errorf("intent for %s delivered to %s", fr.To, a.BeamID)
	}
	if at := env.Attestation; at != nil {
		// Sent without the sender's signature (e.g. a pipeline hop): the
		// directory's published attestation key must have signed it.
		pub, ok := f.attestKeys[at.KeyID]
		if !ok {
			return fmt.Errorf("intent %s attested by unknown key %q", fr.Nonce, at.KeyID)
		}
		if err := wire.VerifyAttested(fr, pub); err != nil {
			return err
		}
	} else {
		pub, ok := f.keys[fr.From]
		if !ok {
			// Not one of ours: the key the directory delivered with it.
			if pub, err = wire.ParsePublicKey(env.SenderPublicKey); err != nil {
				return err
			}
		}
		if err := fr.Verify(pub); err != nil {
			return err
		}
	}
	lat := int64(0)
	res, err := wire.Result{Success: true, Nonce: fr.Nonce, Payload: resultPayload, Latency: &lat}.Build(clock(), a.Private)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return writeEnvelope(wctx, conn, "result", res)
}

// attestationKeys reads a directory's published attestation keys.
func attestationKeys(ctx context.Context, hc *http.Client, base string) (map[string]ed25519.PublicKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/.well-known/beam-attestation", nil)
	if err != nil {
		return nil, fmt.Errorf("attestation keys: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("attestation keys: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("attestation keys: HTTP %d: %v", resp.StatusCode, err)
	}
	_, keys, err := wire.DecodeAttestationKeys(body)
	if err != nil {
		return nil, fmt.Errorf("attestation keys: %w", err)
	}
	return keys, nil
}
