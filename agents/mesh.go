package agents

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// MeshIntent is the intent type of a pipeline hop: the directory delivers
// the whole envelope as the payload.
const MeshIntent = wire.MeshIntent

// Error codes of mesh handler failures: the gateway retries MeshRetryable
// (and any other code) by the actor's policy and never retries
// MeshPermanentCode.
const (
	MeshRetryableCode = "MESH_ERROR"
	MeshPermanentCode = "MESH_PERMANENT"
)

// MeshRoute is an envelope's route: prev and curr are read-only, next is
// the current actor's to rewrite (MeshHop.SetNext).
type MeshRoute = wire.MeshRoute

// MeshStatus is an envelope's status member.
type MeshStatus = wire.MeshStatus

// MeshEnvelope is the envelope of one hop as delivered.
type MeshEnvelope = wire.MeshEnvelope

// MeshHop is one delivery of an envelope to this actor. Handlers read the
// envelope, yield outputs, rewrite next, change headers and stream FLY
// events through it.
type MeshHop struct {
	// Envelope is the envelope as delivered (payload included).
	Envelope MeshEnvelope
	// Attempt is the delivery attempt of this hop, from 1.
	Attempt int
	// From is the authenticated author of this hop's content, the frame's
	// from: PrevActor, or Creator for the first hop. Never trust the
	// payload as the creator's words past the first hop.
	From string
	// Creator is the agent that created the envelope.
	Creator string
	// PrevActor is the author of the payload this hop carries: the actor
	// whose output it is, or the creator when a reroute or a requeue
	// carries the creator's payload on; "" for the first hop, whose payload
	// is the creator's.
	PrevActor string

	c       *Client
	outputs []json.RawMessage
	next    *[]string
	headers map[string]string
}

// Bind decodes the envelope's payload into v.
func (h *MeshHop) Bind(v any) error {
	if err := json.Unmarshal(h.Envelope.Payload, v); err != nil {
		return fmt.Errorf("mesh envelope %s payload: %w", h.Envelope.ID, err)
	}
	return nil
}

// Yield adds an output. The first output keeps the envelope's id; every
// further one becomes a fan-out child with its own id and parent_id set.
func (h *MeshHop) Yield(payload any) error {
	raw, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("mesh yield: %w", err)
	}
	h.outputs = append(h.outputs, raw)
	return nil
}

// SetNext replaces the actors after this one.
func (h *MeshHop) SetNext(actors ...string) {
	next := append([]string{}, actors...)
	h.next = &next
}

// SetHeader sets (or, with "", deletes) a header for the following hops.
// Headers the gateway manages (traceparent, tracestate,
// x-asya-first-attempt) are kept whatever the handler sets.
func (h *MeshHop) SetHeader(key, value string) {
	if h.headers == nil {
		h.headers = map[string]string{}
	}
	h.headers[key] = value
}

// Fly streams an ephemeral event to the envelope's live subscribers
// (POST /api/v1/mesh/{id}/fly with this agent's API key). It is never
// stored.
func (h *MeshHop) Fly(ctx context.Context, data any) error {
	return h.post(ctx, "fly", map[string]any{"data": data}, http.StatusAccepted)
}

// post sends body to the envelope's gateway resource op
// (/api/v1/mesh/{id}/{op}) with this agent's API key or signature and
// expects status want.
func (h *MeshHop) post(ctx context.Context, op string, body any, want int) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("mesh %s: %w", op, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		h.c.base+"/api/v1/mesh/"+url.PathEscape(h.Envelope.ID)+"/"+op, bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("mesh %s: %w", op, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key := h.c.apiKeyValue(); key != "" {
		req.Header.Set("X-Api-Key", key)
	} else if err := SignMeshRequest(req, raw, h.c.id, h.c.clock()); err != nil {
		return fmt.Errorf("mesh %s: %w", op, err)
	}
	resp, err := h.c.http.Do(req)
	if err != nil {
		return fmt.Errorf("mesh %s: %w", op, err)
	}
	defer resp.Body.Close()
	respBody, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != want {
		return fmt.Errorf("mesh %s: HTTP %d: %s", op, resp.StatusCode, bytes.TrimSpace(respBody))
	}
	return nil
}

// SignMeshRequest authenticates a request to the pipeline gateway
// (/api/v1/mesh…) by id's signature instead of an API key: it sets
// X-Beam-Id, X-Beam-Timestamp, X-Beam-Nonce (fresh) and X-Beam-Signature,
// an Ed25519 signature over the canonical JSON of
//
//	{"action":"mesh.request","beamId","method","path","bodySha256","timestamp","nonce"}
//
// where path is the request URI (path and query) and bodySha256 the hex
// SHA-256 of body, which must be exactly the request's body (nil for
// none). A signed request is accepted once, within five minutes of now.
func SignMeshRequest(req *http.Request, body []byte, id *Identity, now time.Time) error {
	if id == nil || len(id.Private) == 0 {
		return errors.New("sign mesh request: no identity with a private key")
	}
	sum := sha256.Sum256(body)
	ts, nonce := wire.FormatTimestamp(now), wire.NewNonce()
	sig, err := wire.SignCanonical(map[string]any{
		"action": "mesh.request", "beamId": id.BeamID, "method": req.Method, "path": req.URL.RequestURI(),
		"bodySha256": hex.EncodeToString(sum[:]), "timestamp": ts, "nonce": nonce,
	}, id.Private)
	if err != nil {
		return fmt.Errorf("sign mesh request: %w", err)
	}
	req.Header.Set(wire.HeaderBeamID, id.BeamID)
	req.Header.Set(wire.HeaderTimestamp, ts)
	req.Header.Set(wire.HeaderNonce, nonce)
	req.Header.Set(wire.HeaderSignature, sig)
	return nil
}

// MeshHandler processes one hop. Its outputs are the payloads it yielded
// plus the returned payload when that is not nil; no output at all ends the
// route (x-sink). An error fails the attempt: retried by the actor's
// policy unless it is MeshPermanent.
type MeshHandler func(ctx context.Context, hop *MeshHop) (any, error)

// meshPermanent marks an error no retry can fix.
type meshPermanent struct{ err error }

func (p meshPermanent) Error() string { return p.err.Error() }
func (p meshPermanent) Unwrap() error { return p.err }

// MeshPermanent wraps err so that the gateway does not retry the hop.
func MeshPermanent(err error) error { return meshPermanent{err: err} }

// HandleMesh registers h for pipeline hops (intent mesh.envelope).
func (c *Client) HandleMesh(h MeshHandler) {
	c.Handle(MeshIntent, func(ctx context.Context, in *Intent) Reply {
		hop := &MeshHop{c: c}
		if err := json.Unmarshal(in.Payload, &hop.Envelope); err != nil {
			return Failure(MeshPermanentCode, "not a mesh envelope: "+err.Error())
		}
		if in.Durable != nil {
			hop.Attempt = in.Durable.Attempt
		}
		hop.From, hop.Creator, hop.PrevActor = in.From, hop.Envelope.Creator, hop.Envelope.PrevActor
		if hop.Attempt > 0 {
			// The seed's "processing" point, while the handler runs; a
			// failed report changes nothing about the hop.
			go func() {
				if err := hop.post(ctx, "processing", map[string]any{"attempt": hop.Attempt}, http.StatusAccepted); err != nil {
					c.log.Debug("mesh processing report", "id", hop.Envelope.ID, "err", err)
				}
			}()
		}
		out, err := h(ctx, hop)
		if err != nil {
			var p meshPermanent
			if errors.As(err, &p) {
				return Failure(MeshPermanentCode, err.Error())
			}
			return Failure(MeshRetryableCode, err.Error())
		}
		if out != nil {
			if err := hop.Yield(out); err != nil {
				return Failure(MeshPermanentCode, err.Error())
			}
		}
		outputs := hop.outputs
		if outputs == nil {
			outputs = []json.RawMessage{}
		}
		return Success(map[string]any{"mesh": struct {
			Outputs []json.RawMessage `json:"outputs"`
			Next    *[]string         `json:"next,omitempty"`
			Headers map[string]string `json:"headers,omitempty"`
		}{outputs, hop.next, hop.headers}})
	})
}
