package directory

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// OriginMesh is the transport of the received event of a pipeline hop that
// the directory relays to a peer directory's agent (RelayToPeer).
const OriginMesh = "mesh"

// pipelineHopIntent is the intent type of a pipeline hop's frame (the
// mesh.envelope intent of bus/mesh).
const pipelineHopIntent = "mesh.envelope"

// meshHookSlot holds the callback set by SetMeshConnected.
type meshHookSlot struct {
	p atomic.Pointer[func(beamID string)]
}

// SetMeshConnected installs the pipeline gateway's callback for an agent
// that attached a session (here, or on another node of a cluster), which
// wakes the envelopes waiting for it as the bus's Connected hook wakes its
// inbox. It is called in its own goroutine. Call it before serving.
func (d *Directory) SetMeshConnected(f func(beamID string)) {
	d.meshHook.p.Store(&f)
}

// meshConnected tells the pipeline gateway that beamID attached a session.
func (d *Directory) meshConnected(beamID string) {
	if f := d.meshHook.p.Load(); f != nil && *f != nil {
		go (*f)(beamID)
	}
}

// DeliverDirect POSTs f to an agent's direct HTTP endpoint exactly as the
// directory's own direct-HTTP path does (same body, headers, timeout and
// response mapping, and the same attestation of an unsigned frame, auth
// saying how its sender was authenticated) and returns the recipient's
// result, or the relay's error for a failed delivery: DIRECT_HTTP_FAILED
// with the same sanitized category the relay gives (the full error goes
// to the server's log only). Nothing is recorded: the caller (the pipeline
// router) owns the nonce's lifecycle.
func (d *Directory) DeliverDirect(f *wire.IntentFrame, auth, endpoint string) (*wire.ResultFrame, *RelayError) {
	inf := &inflight{nonce: f.Nonce, from: f.From, to: f.To, intentType: f.Intent, origin: TransportBus,
		start: d.clock()}
	h, err := d.handOver(f, "", "", auth, "")
	if err != nil {
		return nil, relayErr(CodeInvalidIntent, f.Nonce, "frame cannot be delivered: %v", err)
	}
	rf, err := d.postDirect(inf, h, endpoint)
	if err != nil {
		_, msg := d.directFailed(f.Nonce, f.To, err)
		return nil, relayErr(CodeDirectHTTPFailed, f.Nonce, "%s", msg)
	}
	return rf, nil
}

// CheckPipelineHop applies the relay's admission policy (checkPolicy,
// the same function every relayed intent passes) to a pipeline hop to a
// local actor to, with author as the sender: the agent that chose the hop,
// which is the envelope's creator for the route it gave and the actor that
// last rewrote next for the hops it named. No agent signs a hop (the
// directory attests it), so an actor that requires sender signatures
// receives one only when it accepts attested pipeline hops. It returns ""
// when the hop may be delivered, else the relay's code (FORBIDDEN,
// SENDER_SIGNATURE_REQUIRED) and message.
func (d *Directory) CheckPipelineHop(author, to, intent string) (code, msg string) {
	if code, msg := d.checkPolicy(author, to, intent); code != "" {
		return code, msg
	}
	if a, ok := d.reg.Get(to); ok && a.RequireSenderSignatures && !a.AcceptAttestedPipelineHops {
		return CodeSenderSignatureRequired, SenderSignatureRequired(to, "a pipeline hop") +
			" (or turn on its acceptAttestedPipelineHops setting)"
	}
	return "", ""
}

// PeerFor returns the pinned peer directory that serves beamID when it is
// not an agent of this directory (false without federation, or when no
// pinned peer serves its domain).
func (d *Directory) PeerFor(beamID string) (string, bool) {
	r := d.remoteRouter()
	if r == nil {
		return "", false
	}
	if _, local := d.reg.Get(beamID); local && d.reg.Serves(beamID) {
		return "", false
	}
	return r.PeerFor(beamID)
}

// RelayToPeer relays f, an unsigned frame from one of this directory's
// agents whom the caller authenticated (the pipeline router, for a hop
// whose actor lives in a peer directory), to its recipient in a peer
// directory: an intent of its own nonce with its own trace here (received
// with transport mesh, dispatched over federation, then the peer's
// outcome) and at the peer, which accepts the frame as vouched for by this
// directory and delivers it attested. It waits up to timeout and returns
// the recipient's result frame (success or failure) or the relay's error.
func (d *Directory) RelayToPeer(ctx context.Context, f *wire.IntentFrame, timeout time.Duration) (*wire.ResultFrame, *RelayError) {
	res, rerr := d.Relay(ctx, f, RelayOptions{Origin: OriginMesh, allowUnsigned: true, Timeout: timeout})
	if rerr != nil {
		return nil, rerr
	}
	rf, err := wire.DecodeResultFrame(res)
	if err != nil {
		return nil, relayErr(CodeRelayError, f.Nonce, "the peer's result frame cannot be read: %v", err)
	}
	return rf, nil
}

// checkPipelineRouteAuthor applies a local recipient's policy to the agent
// that chose a pipeline hop relayed to it, as checkPolicy applies it to the
// frame's sender. A hop's frame is from the author of its content (the
// previous actor); the agent that chose the hop is the envelope's route
// author, its "author" or else its "creator". The directory that routes the
// envelope checks that author itself before a hop to one of its own agents
// (CheckPipelineHop); a hop relayed from a peer directory is checked here,
// since only the recipient's directory knows its policy. A frame whose
// payload is no envelope, or whose route author is its sender, has nothing
// more to check.
func (d *Directory) checkPipelineRouteAuthor(f *wire.IntentFrame) (code, msg string) {
	if f.Intent != pipelineHopIntent {
		return "", ""
	}
	var env struct {
		Creator string `json:"creator"`
		Author  string `json:"author"`
	}
	if json.Unmarshal(f.Payload, &env) != nil {
		return "", ""
	}
	author := env.Author
	if author == "" {
		author = env.Creator
	}
	if author == "" || author == f.From {
		return "", ""
	}
	if code, msg := d.checkPolicy(author, f.To, f.Intent); code != "" {
		return code, msg + ": the pipeline hop was chosen by " + author
	}
	return "", ""
}
