package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/beamdir/beam/agents"
)

// The pipeline commands (beam mesh ...) talk to the gateway under
// /api/v1/mesh with an agent's API key or the operator token.

const meshUsage = "beam mesh create|get|list|watch|cancel|pause|resume|trace|dead-letters|requeue [flags] [ID]"

// meshFlags are the flags every mesh subcommand takes.
type meshFlags struct {
	url, identity, apiKey, token string
}

func newMeshFlags(fs *cmdFlags) *meshFlags {
	f := &meshFlags{}
	fs.StringVar(&f.url, "url", defaultDirectoryURL, "base URL of the directory")
	fs.StringVar(&f.identity, "identity", defaultIdentityFile, "identity file whose API key authenticates (when --api-key and --operator-token are empty)")
	fs.StringVar(&f.apiKey, "api-key", os.Getenv("BEAM_API_KEY"), "the agent's API key (default $BEAM_API_KEY)")
	fs.StringVar(&f.token, "operator-token", os.Getenv("BEAM_ADMIN_TOKEN"), "the operator token (default $BEAM_ADMIN_TOKEN)")
	return f
}

// auth sets the request's credentials.
func (f *meshFlags) auth(req *http.Request) error {
	switch {
	case f.token != "":
		req.Header.Set("Authorization", "Bearer "+f.token)
	case f.apiKey != "":
		req.Header.Set("X-Api-Key", f.apiKey)
	default:
		id, err := agents.LoadIdentity(f.identity)
		if err != nil {
			return fmt.Errorf("no credentials: set --api-key or --operator-token, or an identity with an API key: %w", err)
		}
		if id.APIKey == "" {
			return errors.New("no credentials: the identity file holds no API key; set --api-key or --operator-token")
		}
		req.Header.Set("X-Api-Key", id.APIKey)
	}
	return nil
}

// do performs one gateway request and returns the body of a 2xx answer.
func (f *meshFlags) do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	u := strings.TrimRight(f.url, "/") + "/api/v1/mesh" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := f.auth(req); err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error     string `json:"error"`
			ErrorCode string `json:"errorCode"`
		}
		_ = json.Unmarshal(data, &e)
		return nil, fmt.Errorf("%s (HTTP %d): %s", e.ErrorCode, resp.StatusCode, e.Error)
	}
	return data, nil
}

// headerList collects --header k=v flags.
type headerList map[string]string

func (h headerList) String() string { return fmt.Sprint(map[string]string(h)) }
func (h headerList) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("header %q: want NAME=VALUE", v)
	}
	h[k] = val
	return nil
}

func runMesh(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: "+meshUsage)
		return errUsage
	}
	sub, rest := args[0], args[1:]
	name := "beam mesh " + sub
	switch sub {
	case "create":
		fs := newCmdFlags(name, "beam mesh create --route A,B,C [--payload JSON] [--header K=V]... [--timeout 30s] [--creator ID]", stderr,
			"Creates an envelope routed through the actors in order and prints {id, status}.")
		mf := newMeshFlags(fs)
		var route, payload, timeout, creator string
		headers := headerList{}
		fs.StringVar(&route, "route", "", "comma-separated Beam IDs of the actors (required)")
		fs.StringVar(&payload, "payload", "{}", "the payload (JSON)")
		fs.Var(headers, "header", "an envelope header NAME=VALUE (repeatable)")
		fs.StringVar(&timeout, "timeout", "", "the envelope's deadline from now, e.g. 30s (default: the server's)")
		fs.StringVar(&creator, "creator", "", "with --operator-token: the agent the envelope is created for")
		if err := fs.parse(rest, 0, 0); err != nil {
			return err
		}
		if !json.Valid([]byte(payload)) {
			return fmt.Errorf("--payload is not valid JSON")
		}
		body := map[string]any{"route": splitList(route), "payload": json.RawMessage(payload), "headers": headers}
		if timeout != "" {
			body["timeout"] = timeout
		}
		if creator != "" {
			body["creator"] = creator
		}
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		data, err := mf.do(ctx, http.MethodPost, "", nil, raw)
		return printBody(stdout, data, err)
	case "list", "dead-letters":
		fs := newCmdFlags(name, "beam "+strings.TrimPrefix(name, "beam ")+" [--status S,S] [--parent ID] [--limit N] [--offset N]", stderr,
			"Lists envelopes, newest first, one JSON object per line (dead-letters: those in x-sump).")
		mf := newMeshFlags(fs)
		var status, parent string
		var limit, offset int
		fs.StringVar(&status, "status", "", "only these statuses (pending, running, paused, succeeded, failed, canceled)")
		fs.StringVar(&parent, "parent", "", "only the fan-out children of this envelope")
		fs.IntVar(&limit, "limit", 100, "most envelopes to list (at most 500)")
		fs.IntVar(&offset, "offset", 0, "envelopes to skip")
		if err := fs.parse(rest, 0, 0); err != nil {
			return err
		}
		q := url.Values{"limit": {fmt.Sprint(limit)}, "offset": {fmt.Sprint(offset)}}
		if status != "" {
			q.Set("status", status)
		}
		if parent != "" {
			q.Set("parent", parent)
		}
		path := ""
		if sub == "dead-letters" {
			path = "/dead-letters"
		}
		data, err := mf.do(ctx, http.MethodGet, path, q, nil)
		if err != nil {
			return err
		}
		return printMessages(stdout, data)
	case "get", "cancel", "pause", "resume", "trace", "requeue":
		fs := newCmdFlags(name, "beam mesh "+sub+" ID", stderr, meshActions[sub])
		mf := newMeshFlags(fs)
		if err := fs.parse(rest, 1, 1); err != nil {
			return err
		}
		path := "/" + url.PathEscape(fs.Arg(0))
		method := http.MethodPost
		switch sub {
		case "get":
			method = http.MethodGet
		case "trace":
			method, path = http.MethodGet, path+"/trace"
		case "cancel":
			method = http.MethodDelete
		default:
			path += "/" + sub
		}
		data, err := mf.do(ctx, method, path, nil, nil)
		return printBody(stdout, data, err)
	case "watch":
		fs := newCmdFlags(name, "beam mesh watch [--last-event-id N] ID", stderr,
			"Prints the envelope's live events (status, progress, fly) until it ends, one line each:",
			"EVENT ID DATA.")
		mf := newMeshFlags(fs)
		var last string
		fs.StringVar(&last, "last-event-id", "", "resume after this event id")
		if err := fs.parse(rest, 1, 1); err != nil {
			return err
		}
		return mf.watch(ctx, fs.Arg(0), last, stdout)
	default:
		fmt.Fprintf(stderr, "beam mesh: unknown subcommand %q\nusage: %s\n", sub, meshUsage)
		return errUsage
	}
}

var meshActions = map[string]string{
	"get":     "Prints the envelope: status, progress, hop, route, headers and payload.",
	"cancel":  "Cancels the envelope; a hop in flight finishes at its actor, its answer is dropped.",
	"pause":   "Pauses the envelope before its next hop.",
	"resume":  "Resumes a paused envelope.",
	"trace":   "Prints the envelope's events in the log.",
	"requeue": "Sends a dead envelope again as a new one from the actor it failed at (operator).",
}

func splitList(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func printBody(stdout io.Writer, data []byte, err error) error {
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	fmt.Fprintln(stdout, buf.String())
	return nil
}

// watch prints the SSE stream of envelope id until the server closes it.
func (f *meshFlags) watch(ctx context.Context, id, last string, stdout io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(f.url, "/")+"/api/v1/mesh/"+url.PathEscape(id)+"/events", nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if err := f.auth(req); err != nil {
		return err
	}
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(data))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	var event, evID, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event != "" {
				if evID == "" {
					evID = "-"
				}
				fmt.Fprintf(stdout, "%s %s %s\n", event, evID, data)
			}
			event, evID, data = "", "", ""
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			evID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		}
	}
	return sc.Err()
}
