package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/beamdir/beam/agents"
)

// The agent commands (keygen, register, send, listen) act as one agent
// against a running directory, using the Go SDK in package agents.

const (
	defaultDirectoryURL = "http://127.0.0.1:3100"
	defaultIdentityFile = "beam-identity.json"
)

// agentFlags are the flags shared by the commands that talk to a directory.
type agentFlags struct {
	url      string
	identity string
}

// newAgentFlags registers the agent flags in fs.
func newAgentFlags(fs *flag.FlagSet) *agentFlags {
	f := &agentFlags{}
	fs.StringVar(&f.url, "url", defaultDirectoryURL, "base URL of the directory")
	fs.StringVar(&f.identity, "identity", defaultIdentityFile, "identity file (beam keygen writes it)")
	return f
}

// loadIdentity loads the identity file path; a missing file is an error
// that says how to name or create one.
func loadIdentity(path string) (*agents.Identity, error) {
	id, err := agents.LoadIdentity(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no identity file %s: pass --identity FILE (or set BEAM_IDENTITY), or create one with "+
			"beam keygen --beam-id NAME@ORG.beam.directory --out %s and beam register --identity %s", path, path, path)
	}
	return id, err
}

// client loads the identity and builds a client for it.
func (f *agentFlags) client(logger *slog.Logger) (*agents.Client, *agents.Identity, error) {
	id, err := loadIdentity(f.identity)
	if err != nil {
		return nil, nil, err
	}
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: f.url, Identity: id, Logger: logger})
	if err != nil {
		return nil, nil, err
	}
	return c, id, nil
}

func runKeygen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam keygen", "beam keygen --beam-id ID [--out FILE] [--force]", stderr,
		"Generates an Ed25519 key pair for an agent and writes it as an identity file",
		"({beamId, publicKeyBase64, privateKeyBase64}, the beam-protocol-sdk export format).")
	var beamID, out string
	var force bool
	fs.StringVar(&beamID, "beam-id", "", "Beam ID of the new agent, e.g. assistant@acme.beam.directory (required)")
	fs.StringVar(&out, "out", defaultIdentityFile, "identity file to write (mode 0600)")
	fs.BoolVar(&force, "force", false, "overwrite an existing identity file")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	if beamID == "" {
		return fs.missing("beam-id")
	}
	if !force {
		if _, err := os.Stat(out); err == nil {
			return fmt.Errorf("%s exists (use --force to overwrite it)", out)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("check %s: %w", out, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
		return fmt.Errorf("create the directory of %s: %w", out, err)
	}
	id, err := agents.GenerateIdentity(beamID)
	if err != nil {
		return err
	}
	if err := id.Save(out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "beam id:    %s\npublic key: %s\nwritten to: %s\n", id.BeamID, id.PublicKeyBase64(), out)
	return nil
}

func runRegister(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam register", "beam register [--url URL] [--identity FILE] --name NAME [--capabilities a,b]", stderr,
		"Registers the identity's agent with the directory. A returned API key is stored",
		"in the identity file (field apiKey) and used by later commands.")
	af := newAgentFlags(fs.FlagSet)
	var name, caps string
	fs.StringVar(&name, "name", "", "display name of the agent (required)")
	fs.StringVar(&caps, "capabilities", "", "comma-separated capabilities, e.g. quote.request,inventory.check")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	if name == "" {
		return fs.missing("name")
	}
	c, id, err := af.client(quietLogger(stderr))
	if err != nil {
		return err
	}
	defer c.Close()
	var capabilities []string
	for _, s := range strings.Split(caps, ",") {
		if s = strings.TrimSpace(s); s != "" {
			capabilities = append(capabilities, s)
		}
	}
	res, err := c.Register(ctx, name, capabilities)
	if err != nil {
		return err
	}
	verb := "updated"
	if res.Created {
		verb = "registered"
	}
	fmt.Fprintf(stdout, "%s %s (did %s)\n", verb, res.Agent.BeamID, res.Agent.DID)
	if res.APIKey != "" {
		id.APIKey = res.APIKey
		if err := id.Save(af.identity); err != nil {
			return fmt.Errorf("store api key: %w", err)
		}
		fmt.Fprintf(stdout, "api key stored in %s\n", af.identity)
	}
	return nil
}

func runSend(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam send", "beam send [--url URL] [--identity FILE] TO INTENT [JSON-PAYLOAD]", stderr,
		"Signs an intent, sends it with POST /intents/send and prints the result frame.",
		"Exits non-zero when the intent fails.")
	af := newAgentFlags(fs.FlagSet)
	var timeout time.Duration
	fs.DurationVar(&timeout, "timeout", 65*time.Second, "how long to wait for the result")
	durable := fs.Bool("durable", false, "hand the intent to the message bus and print its receipt instead of waiting for the result")
	if err := fs.parse(args, 2, 3); err != nil {
		return err
	}
	to, intent := fs.Arg(0), fs.Arg(1)
	var payload json.RawMessage
	if fs.NArg() == 3 {
		payload = json.RawMessage(fs.Arg(2))
		if !json.Valid(payload) {
			return fmt.Errorf("payload is not valid JSON: %s", fs.Arg(2))
		}
	}
	c, _, err := af.client(quietLogger(stderr))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if *durable {
		return sendDurable(ctx, c, to, intent, payload, stdout, stderr)
	}
	res, err := c.Send(ctx, to, intent, payload)
	if res != nil {
		fmt.Fprintln(stdout, string(res.Raw))
	}
	return explainSendError(err, to)
}

// explainSendError adds what to do next to the failures of beam send:
// the nonce of an OFFLINE, TIMEOUT or DELIVERY_FAILED intent (retrying it is a new attempt,
// beam trace shows what happened) and a hint for an unknown recipient.
func explainSendError(err error, to string) error {
	var e *agents.Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	switch e.Code {
	case "OFFLINE", "TIMEOUT", "DELIVERY_FAILED":
		if e.Nonce != "" {
			return fmt.Errorf("%w\nnonce %s: beam trace %s shows its events; send again (or use --durable to queue it until %s connects)", err, e.Nonce, e.Nonce, to)
		}
	case "UNKNOWN_AGENT":
		return fmt.Errorf("%w\n%s is not registered with this directory: check the Beam ID (beam register creates agents)", err, to)
	}
	return err
}

func runListen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam listen", "beam listen [--url URL] [--identity FILE] [--echo]", stderr,
		"Connects the identity's agent to the directory (reconnecting when the session drops)",
		"and answers every intent it receives, logging each one, until interrupted.",
		"Without --echo each intent is answered with {\"received\":true}.")
	af := newAgentFlags(fs.FlagSet)
	var echo bool
	var logLevel, logFormat string
	fs.BoolVar(&echo, "echo", false, "answer every intent with its payload (conversation.message: {\"message\":\"Echo: …\"}; a pipeline hop: its payload with this agent added to \"echoedBy\")")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	logger, err := newLogger(stderr, logLevel, logFormat)
	if err != nil {
		return err
	}
	c, id, err := af.client(logger)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		attrs := []any{"from", in.From, "intent", in.Type, "nonce", in.Nonce, "payload", string(in.Payload)}
		if a := in.Attested; a != nil {
			// Signed by the directory for a sender it authenticated, not by the sender.
			attrs = append(attrs, "attestedBy", a.By, "senderAuth", a.Auth)
		}
		logger.Info("intent", attrs...)
		if !echo {
			return agents.Success(map[string]any{"received": true})
		}
		if in.Type == agents.IntentConversation {
			var m struct {
				Message string `json:"message"`
			}
			_ = in.Bind(&m)
			return agents.Success(map[string]string{"message": "Echo: " + m.Message})
		}
		return agents.Success(in.Payload)
	})
	if echo {
		// A pipeline hop is answered with its payload, never the envelope
		// it arrived in, so a route of echo agents ends with a flat payload.
		c.HandleMesh(func(_ context.Context, hop *agents.MeshHop) (any, error) {
			logger.Info("pipeline hop", "envelope", hop.Envelope.ID, "hop", hop.Envelope.Hop,
				"creator", hop.Envelope.Creator, "payload", string(hop.Envelope.Payload))
			return echoHop(hop.Envelope.Payload, id.BeamID), nil
		})
	}
	if err := c.Connect(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening as %s on %s (Ctrl-C to stop)\n", id.BeamID, af.url)
	<-ctx.Done()
	logger.Info("stopping")
	return nil
}

// echoHop is beam listen --echo's answer to a pipeline hop: the payload
// with the agent's Beam ID appended to its "echoedBy" list when the payload
// is an object, the payload unchanged otherwise.
func echoHop(payload json.RawMessage, beamID string) json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(payload, &m); err != nil || m == nil {
		return payload
	}
	var by []string
	_ = json.Unmarshal(m["echoedBy"], &by)
	raw, err := json.Marshal(append(by, beamID))
	if err != nil {
		return payload
	}
	m["echoedBy"] = raw
	out, err := json.Marshal(m)
	if err != nil {
		return payload
	}
	return out
}

// quietLogger logs warnings and errors of the short-lived agent commands.
func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
