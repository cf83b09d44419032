package agents

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// replayWindow is how far an incoming intent's timestamp may be from the
// client's clock, as in beam/1.
const replayWindow = 5 * time.Minute

// Handler answers one incoming intent. It runs on its own goroutine with a
// context that ends after ClientConfig.HandlerTimeout or at Close. A panic
// is recovered and answered as the failure INTENT_HANDLER_ERROR.
type Handler func(ctx context.Context, in *Intent) Reply

// Intent is an incoming intent whose signature and timestamp the client has
// verified.
type Intent struct {
	// From, To, Type and Nonce are the frame's from, to, intent and nonce.
	From, To, Type, Nonce string
	// Timestamp is the sender's frame timestamp.
	Timestamp time.Time
	// Payload is the payload object exactly as received.
	Payload json.RawMessage
	// SenderPublicKey is the sender's key the frame was verified with; nil
	// when the frame is attested (see Attested).
	SenderPublicKey ed25519.PublicKey
	// Attested is set when the directory, not the sender, signed the frame
	// (the sender authenticated with an API key, the bus key, a beam/2 JWS
	// or a peer's vouching); the client verified that signature against the
	// directory's published attestation key.
	Attested *Attested
	// ActingBeamID is the agent that sent on behalf of From under a
	// delegation, when the directory reports one.
	ActingBeamID string
	// Frame is the decoded frame.
	Frame *wire.IntentFrame
	// Durable is set when the intent came from the message bus.
	Durable *DurableDelivery
	// Protocol is ProtocolBeam2 when the intent came as a beam/2 JWS
	// (verified; the reply is then a result JWS too), else ProtocolBeam1.
	Protocol string
	// JWS is the sender's beam/2 envelope, verbatim; "" for beam/1.
	JWS string
}

// Bind decodes the payload into v.
func (in *Intent) Bind(v any) error {
	if err := json.Unmarshal(in.Payload, v); err != nil {
		return fmt.Errorf("intent %s payload: %w", in.Type, err)
	}
	return nil
}

// Reply is a handler's answer. Build it with Success, Failure or Accept.
// The zero Reply is a success without payload.
type Reply struct {
	failed  bool
	payload any
	code    string
	message string
}

// Success answers with success true and payload (nil for none). The payload
// must encode to a JSON object.
func Success(payload any) Reply { return Reply{payload: payload} }

// Failure answers with success false, errorCode code and error message.
func Failure(code, message string) Reply {
	if code == "" {
		code = "INTENT_FAILED"
	}
	return Reply{failed: true, code: code, message: message}
}

// Accept answers with an asynchronous acceptance: the intent is delivered
// and taken on, but not finished ({"accepted":true,
// "acknowledgement":"accepted","terminal":false}). The directory leaves the
// intent delivered instead of acked.
func Accept() Reply {
	return Reply{payload: json.RawMessage(`{"accepted":true,"acknowledgement":"accepted","terminal":false}`)}
}

// Handle registers h for intents of type intent; "*" matches every intent
// without a handler of its own. A later Handle for the same type replaces
// the earlier one, and a nil h removes it. Handlers apply to the current
// session and every reconnected one. Intents nobody handles are answered
// with the failure UNSUPPORTED_INTENT.
func (c *Client) Handle(intent string, h Handler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h == nil {
		delete(c.handlers, intent)
		return
	}
	c.handlers[intent] = h
}

func (c *Client) handler(intent string) Handler {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.handlers[intent]; ok {
		return h
	}
	return c.handlers["*"]
}

// receive verifies an incoming intent and runs its handler. Frames that do
// not verify are dropped and logged, as beam/1 receivers do. An attested
// intent whose key is not cached yet is verified off the session's reader,
// since the key document is fetched first.
func (c *Client) receive(env envelope) {
	if a := env.Attestation; a != nil {
		if _, ok := c.cachedAttestationKey(a.KeyID); !ok {
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.receiveVerified(env)
			}()
			return
		}
	}
	c.receiveVerified(env)
}

// receiveVerified is receive once the attestation key (if any) can be had.
func (c *Client) receiveVerified(env envelope) {
	in, err := c.verifyIncoming(env)
	if err != nil {
		c.log.Warn("beam: dropping incoming intent", "err", err)
		return
	}
	h := c.handler(in.Type)
	started := c.clock()
	if h == nil {
		c.reply(in, Failure("UNSUPPORTED_INTENT", fmt.Sprintf("no handler for intent %q", in.Type)), started)
		return
	}
	select {
	case c.sem <- struct{}{}:
	default:
		c.log.Warn("beam: too many handlers running; refusing intent", "nonce", in.Nonce, "intent", in.Type)
		c.reply(in, Failure("AGENT_BUSY", "the agent is busy; try again later"), started)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.sem }()
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.HandlerTimeout)
		defer cancel()
		c.reply(in, c.run(ctx, h, in), started)
	}()
}

// run calls h, turning a panic into a failure reply.
func (c *Client) run(ctx context.Context, h Handler, in *Intent) (r Reply) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("beam: handler panicked", "intent", in.Type, "nonce", in.Nonce, "panic", p)
			r = Failure("INTENT_HANDLER_ERROR", fmt.Sprintf("handler panicked: %v", p))
		}
	}()
	return h(ctx, in)
}

// verifyIncoming decodes and checks an intent message from the directory.
func (c *Client) verifyIncoming(env envelope) (*Intent, error) {
	if env.SenderPublicKey == "" {
		return nil, fmt.Errorf("intent without senderPublicKey")
	}
	pub, err := wire.ParsePublicKey(env.SenderPublicKey)
	if err != nil {
		return nil, fmt.Errorf("senderPublicKey: %w", err)
	}
	protocol := ProtocolBeam1
	var f *wire.IntentFrame
	if env.JWS != "" {
		// beam/2: the JWS carries the frame; kid must be its from.
		protocol = ProtocolBeam2
		f, err = verifyIncomingJWS(env.JWS, pub)
	} else {
		f, err = wire.DecodeIntentFrame(env.Frame)
	}
	if err != nil {
		return nil, err
	}
	if f.To != c.id.BeamID {
		return nil, fmt.Errorf("intent %q is addressed to %q, not to this agent", f.Nonce, f.To)
	}
	ts, err := wire.ParseTimestamp(f.Timestamp)
	if err != nil {
		return nil, fmt.Errorf("intent %q: %w", f.Nonce, err)
	}
	// A bus delivery may be a retry of a frame signed long ago; the
	// directory's log guards its nonce, so the window applies only to
	// direct intents (unsigned bus frames carry a fresh timestamp anyway).
	if skew := c.clock().Sub(ts); (skew > replayWindow || skew < -replayWindow) && env.Bus == nil {
		return nil, fmt.Errorf("intent %q: timestamp %s is outside the replay window", f.Nonce, f.Timestamp)
	}
	// A frame is either the sender's, signed with its key, or attested by
	// the directory and marked so; never unsigned.
	var attested *Attested
	switch {
	case env.Attestation != nil:
		if protocol != ProtocolBeam1 {
			return nil, fmt.Errorf("intent %q: an attested intent must be a beam/1 frame", f.Nonce)
		}
		if attested, err = c.verifyAttested(f, env, pub); err != nil {
			return nil, err
		}
		pub = nil
	case protocol == ProtocolBeam1:
		if c.isAttestationKey(pub) {
			return nil, fmt.Errorf("intent %q is signed by the directory's attestation key but not marked attested", f.Nonce)
		}
		if err := f.Verify(pub); err != nil {
			return nil, err
		}
	}
	var durable *DurableDelivery
	if env.Bus != nil {
		d := env.Bus.DurableDelivery
		durable = &d
	}
	return &Intent{
		From: f.From, To: f.To, Type: f.Intent, Nonce: f.Nonce,
		Timestamp:       ts,
		Payload:         f.Payload,
		SenderPublicKey: pub,
		Attested:        attested,
		ActingBeamID:    env.ActingBeamID,
		Frame:           f,
		Durable:         durable,
		Protocol:        protocol,
		JWS:             env.JWS,
	}, nil
}

// resultFor turns a handler's reply into the result for nonce.
func resultFor(nonce string, r Reply) wire.Result {
	res := wire.Result{Success: !r.failed, Nonce: nonce}
	switch {
	case r.failed:
		res.Error, res.ErrorCode = r.message, r.code
	case r.payload != nil:
		raw, err := encodePayload(r.payload)
		if err != nil {
			return wire.Result{Nonce: nonce, ErrorCode: "INTENT_HANDLER_ERROR", Error: "handler reply: " + err.Error()}
		}
		res.Payload = raw
	}
	return res
}

// reply signs r as the result for in and sends it on the live session
// (the directory accepts results only from the recipient's current session):
// a beam/2 intent is answered with a result JWS whose frame also carries
// the beam/1 signature, a beam/1 intent with a signed beam/1 frame.
func (c *Client) reply(in *Intent, r Reply, started time.Time) {
	nonce := in.Nonce
	res := resultFor(nonce, r)
	now := c.clock()
	latency := max(now.Sub(started).Milliseconds(), 0)
	res.Latency = &latency
	frame, err := res.Build(now, c.id.Private)
	if err != nil {
		c.log.Error("beam: building result", "nonce", nonce, "err", err)
		return
	}
	conn := c.session()
	if conn == nil {
		c.log.Warn("beam: result dropped, no session", "nonce", nonce)
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if in.Protocol == ProtocolBeam2 {
		err = c.replyJWS(ctx, conn, nonce, frame)
	} else {
		err = writeFrame(ctx, conn, "result", frame)
	}
	if err != nil {
		c.log.Warn("beam: sending result", "nonce", nonce, "err", err)
	}
}
