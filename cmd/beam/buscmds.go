package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/beamdir/beam/agents"
)

// The bus commands (send --durable, poll, ack, dead-letters, requeue) use
// the directory's durable message bus (/v1/beam/...).

// sendDurable is `beam send --durable`: it hands the signed intent to the
// bus and prints the receipt ({message_id, nonce, status, …}).
func sendDurable(ctx context.Context, c *agents.Client, to, intent string, payload json.RawMessage, stdout, stderr io.Writer) error {
	rec, err := c.SendDurable(ctx, to, intent, payload, nil)
	if err != nil {
		return err
	}
	if err := printJSON(stdout, rec); err != nil {
		return err
	}
	// The receipt says the message is stored, not that it arrived.
	fmt.Fprintf(stderr, "stored (%s); the outcome comes later: beam trace %s (--data-dir of the directory, or --url) shows it, beam dead-letters lists it if every retry fails\n", rec.Status, rec.Nonce)
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func runPoll(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam poll", "beam poll [--url URL] [--identity FILE] [--claim [--lease 60s]] [--limit N] [--status S]", stderr,
		"Prints the identity's bus messages, one JSON object per line: the accepted, not yet",
		"acked deliveries, or with --claim queued messages handed out under a lease.")
	af := newAgentFlags(fs.FlagSet)
	var claim bool
	var lease time.Duration
	var limit int
	var status string
	fs.BoolVar(&claim, "claim", false, "claim queued messages under a lease (ack each before it runs out)")
	lease = 60 * time.Second
	fs.Var(leaseFlag{&lease}, "lease", "lease length with --claim: seconds (60) or a duration (90s, 2m)")
	fs.IntVar(&limit, "limit", 10, "most messages to return (at most 100)")
	fs.StringVar(&status, "status", "", "list messages in this state instead of delivered (not with --claim)")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	c, _, err := af.client(quietLogger(stderr))
	if err != nil {
		return err
	}
	defer c.Close()
	msgs, err := c.Poll(ctx, agents.PollOptions{Claim: claim, Lease: lease, Limit: limit, Status: status})
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := printJSON(stdout, m); err != nil {
			return err
		}
	}
	if len(msgs) == 0 && !claim && status == "" {
		// Nothing delivered and unacked: say where queued messages are.
		queued, err := c.Poll(ctx, agents.PollOptions{Limit: 100, Status: "queued"})
		if err == nil && len(queued) > 0 {
			fmt.Fprintf(stderr, "no delivered messages to ack; %d queued (beam poll --status queued lists them, beam poll --claim takes them under a lease)\n", len(queued))
		}
	}
	return nil
}

func runAck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam ack", "beam ack [--url URL] [--identity FILE] [--status acked|failed] [--response JSON] [--lease-id L] MESSAGE_ID", stderr,
		"Records the outcome of a bus message delivered to the identity's agent.")
	af := newAgentFlags(fs.FlagSet)
	var status, response, leaseID string
	fs.StringVar(&status, "status", "acked", "outcome: acked or failed")
	fs.StringVar(&response, "response", "", "JSON object stored as the response and returned to the sender")
	fs.StringVar(&leaseID, "lease-id", "", "the lease a claimed message was handed out under")
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	var resp any
	if response != "" {
		if !json.Valid([]byte(response)) {
			return fmt.Errorf("response is not valid JSON: %s", response)
		}
		resp = json.RawMessage(response)
	}
	c, _, err := af.client(quietLogger(stderr))
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Ack(ctx, &agents.DurableMessage{ID: fs.Arg(0), LeaseID: leaseID}, agents.AckStatus(status), resp)
	if err != nil {
		if leaseID == "" && strings.Contains(err.Error(), "poll lease") {
			return fmt.Errorf("%w\nthe message was claimed with beam poll --claim: pass --lease-id with the lease_id that beam poll --claim printed for it", err)
		}
		return err
	}
	return printJSON(stdout, res)
}

func runDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam dead-letters", "beam dead-letters [--url URL] [--admin-token T | --data-dir DIR] [--sender S] [--recipient R] [--intent I] [--limit N]", stderr,
		"Lists dead-lettered bus messages, newest first, one JSON object per line.")
	of := newOperatorFlags(fs.FlagSet)
	var sender, recipient, intent string
	var limit int
	fs.StringVar(&sender, "sender", "", "only messages from this agent")
	fs.StringVar(&recipient, "recipient", "", "only messages to this agent")
	fs.StringVar(&intent, "intent", "", "only messages of this intent")
	fs.IntVar(&limit, "limit", 100, "most messages to list (at most 500)")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	for k, v := range map[string]string{"sender": sender, "recipient": recipient, "intent": intent} {
		if v != "" {
			q.Set(k, v)
		}
	}
	body, _, err := of.call(ctx, http.MethodGet, "/v1/beam/dead-letter", q, nil)
	if err != nil {
		return err
	}
	var list struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if json.Unmarshal(body, &list) == nil && len(list.Messages) == 0 {
		// On stderr: stdout stays one JSON object per line.
		fmt.Fprintln(stderr, "no dead-lettered messages")
		return nil
	}
	return printMessages(stdout, body)
}

// printMessages prints each member of an answer's "messages" array as one
// line of compact JSON.
func printMessages(w io.Writer, body []byte) error {
	var out struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	for _, m := range out.Messages {
		var buf bytes.Buffer
		if err := json.Compact(&buf, m); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
		fmt.Fprintln(w, buf.String())
	}
	return nil
}

func runRequeue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam requeue", "beam requeue [--url URL] [--admin-token T | --data-dir DIR] MESSAGE_ID|NONCE", stderr,
		"Moves a dead-lettered (or failed) bus message back to the queue, same nonce, and",
		"delivers it at once when its recipient is online. The message is named by its id",
		"or by its nonce (as beam dead-letters prints them).")
	of := newOperatorFlags(fs.FlagSet)
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	ref := fs.Arg(0)
	body, status, err := of.call(ctx, http.MethodPost, "/v1/beam/dead-letter/"+url.PathEscape(ref)+"/requeue", nil, nil)
	if status == http.StatusNotFound {
		// Not a message id: look for the message with this nonce.
		id, ferr := findMessageByNonce(ctx, of, ref)
		if ferr != nil {
			return ferr
		}
		if id == "" {
			return fmt.Errorf("no bus message has the id or nonce %q; beam dead-letters lists dead-lettered messages with their id and nonce", ref)
		}
		body, _, err = of.call(ctx, http.MethodPost, "/v1/beam/dead-letter/"+url.PathEscape(id)+"/requeue", nil, nil)
	}
	if err != nil {
		return err
	}
	_, err = stdout.Write(body)
	return err
}

// findMessageByNonce returns the id of the bus message whose nonce is
// nonce (dead-lettered, failed or in any other state), or "" when there is
// none.
func findMessageByNonce(ctx context.Context, of *operatorFlags, nonce string) (string, error) {
	body, status, err := of.call(ctx, http.MethodGet, "/v1/beam/messages/"+url.PathEscape(nonce), nil, nil)
	if status == http.StatusNotFound {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var m struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return "", fmt.Errorf("decode message: %w", err)
	}
	return m.ID, nil
}
