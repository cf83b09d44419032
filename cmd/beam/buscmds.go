package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
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
func sendDurable(ctx context.Context, c *agents.Client, to, intent string, payload json.RawMessage, stdout io.Writer) error {
	rec, err := c.SendDurable(ctx, to, intent, payload, nil)
	if err != nil {
		return err
	}
	return printJSON(stdout, rec)
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
	fs.DurationVar(&lease, "lease", 60*time.Second, "lease length with --claim")
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
		return err
	}
	return printJSON(stdout, res)
}

// operatorFlags are the flags of the operator bus commands.
type operatorFlags struct {
	url string
	key string
}

// newOperatorFlags registers the operator flags in fs.
func newOperatorFlags(fs *flag.FlagSet) *operatorFlags {
	f := &operatorFlags{}
	fs.StringVar(&f.url, "url", defaultDirectoryURL, "base URL of the directory")
	fs.StringVar(&f.key, "bus-api-key", "", "the bus key or the operator token")
	return f
}

// call performs one operator request and returns the body of a 2xx answer.
func (f *operatorFlags) call(ctx context.Context, method, path string, query url.Values) ([]byte, error) {
	if f.key == "" {
		return nil, fmt.Errorf("--bus-api-key (or BEAM_BUS_API_KEY) is required")
	}
	u := strings.TrimRight(f.url, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+f.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error     string `json:"error"`
			ErrorCode string `json:"errorCode"`
		}
		_ = json.Unmarshal(body, &e)
		return nil, fmt.Errorf("%s (HTTP %d): %s", e.ErrorCode, resp.StatusCode, e.Error)
	}
	return body, nil
}

func runDeadLetters(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam dead-letters", "beam dead-letters [--url URL] --bus-api-key KEY [--sender S] [--recipient R] [--intent I] [--limit N]", stderr,
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
	body, err := of.call(ctx, http.MethodGet, "/v1/beam/dead-letter", q)
	if err != nil {
		return err
	}
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
		fmt.Fprintln(stdout, buf.String())
	}
	return nil
}

func runRequeue(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam requeue", "beam requeue [--url URL] --bus-api-key KEY MESSAGE_ID", stderr,
		"Moves a dead-lettered (or failed) bus message back to the queue, same nonce, and",
		"delivers it at once when its recipient is online.")
	of := newOperatorFlags(fs.FlagSet)
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	body, err := of.call(ctx, http.MethodPost, "/v1/beam/dead-letter/"+url.PathEscape(fs.Arg(0))+"/requeue", nil)
	if err != nil {
		return err
	}
	_, err = stdout.Write(body)
	return err
}
