package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/beamdir/beam/agents"
)

// The pipeline commands (beam mesh ...) talk to the gateway under
// /api/v1/mesh as an agent (its API key) or as the operator (the operator
// token, found as every operator command finds it).

const meshUsage = "beam mesh create|get|list|watch|cancel|pause|resume|trace|dead-letters|requeue [flags] [ID]"

// meshFlags are the flags every mesh subcommand takes.
type meshFlags struct {
	fs             *cmdFlags
	url, identity  string
	apiKey         string
	token, dataDir string
	// asOperator, when set, is called before a request goes out with the
	// operator's credentials; its error stops the request.
	asOperator func() error
}

func newMeshFlags(fs *cmdFlags) *meshFlags {
	f := &meshFlags{fs: fs}
	fs.StringVar(&f.url, "url", defaultDirectoryURL, "base URL of the directory")
	fs.StringVar(&f.identity, "identity", defaultIdentityFile, "identity file whose API key authenticates as its agent")
	fs.StringVar(&f.apiKey, "api-key", "", "the agent's API key")
	fs.StringVar(&f.token, "admin-token", "", "act as the operator with this token (default: the admin.token of --data-dir)")
	fs.alias("operator-token", "admin-token")
	fs.StringVar(&f.dataDir, "data-dir", "./beam-data", "data directory of the running directory: act as the operator with its admin.token")
	return f
}

// auth sets the request's credentials, the first of: the operator token
// (--admin-token, BEAM_ADMIN_TOKEN); the agent's --api-key; an --identity
// given; the admin.token of a --data-dir given; the default identity file;
// the admin.token of the default data directory.
func (f *meshFlags) auth(req *http.Request) error {
	var identitySet, dataDirSet bool
	f.fs.Visit(func(fl *flag.Flag) {
		identitySet = identitySet || fl.Name == "identity"
		dataDirSet = dataDirSet || fl.Name == "data-dir"
	})
	op := &operatorFlags{url: f.url, token: f.token, dataDir: f.dataDir}
	switch {
	case f.token != "":
		req.Header.Set("Authorization", "Bearer "+f.token)
		return nil
	case f.apiKey != "":
		req.Header.Set("X-Api-Key", f.apiKey)
		return nil
	case identitySet:
		return f.agentKey(req)
	case dataDirSet:
		token, err := op.bearer()
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
	if err := f.agentKey(req); err == nil {
		return nil
	}
	if token, err := op.bearer(); err == nil {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
	return fmt.Errorf("no credentials: pass --identity FILE (an agent's identity with an API key) or --api-key KEY, " +
		"or as the operator --admin-token TOKEN, BEAM_ADMIN_TOKEN or --data-dir DIR (the directory's data directory, whose admin.token is used)")
}

// agentKey sets the API key of the identity file.
func (f *meshFlags) agentKey(req *http.Request) error {
	id, err := loadIdentity(f.identity)
	if err != nil {
		return fmt.Errorf("no credentials: %w (pass --identity FILE or --api-key KEY, or as the operator --admin-token or --data-dir)", err)
	}
	if id.APIKey == "" {
		return fmt.Errorf("no credentials: the identity file %s holds no API key (beam register stores one); pass --api-key KEY, or as the operator --admin-token or --data-dir", f.identity)
	}
	req.Header.Set("X-Api-Key", id.APIKey)
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
	if f.asOperator != nil && req.Header.Get("Authorization") != "" {
		if err := f.asOperator(); err != nil {
			return nil, err
		}
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
		return nil, agents.ErrorFromResponse(resp, data)
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
		meshHelp(stderr)
		return errUsage
	}
	sub, rest := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "help" {
		meshHelp(stderr)
		return nil
	}
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
		fs.StringVar(&creator, "creator", "", "as the operator: the agent the envelope is created for")
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
		} else {
			mf.asOperator = func() error {
				why := fmt.Sprintf("no --api-key, and no agent's identity file with an API key at %s", mf.identity)
				if mf.token != "" {
					why = "--admin-token or BEAM_ADMIN_TOKEN is set"
				}
				return fmt.Errorf("beam mesh create acts as the operator here (%s), "+
					"and the operator creates envelopes only on behalf of an agent: pass --identity FILE to create the envelope as that agent, "+
					"or --creator ID to create it for agent ID", why)
			}
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
		var asJSON bool
		if sub == "trace" {
			fs.BoolVar(&asJSON, "json", false, "print the events as JSON lines")
		}
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
		if sub == "trace" && err == nil {
			events, err := decodeEvents(data)
			if err != nil {
				return err
			}
			if len(events) == 0 {
				return fmt.Errorf("envelope %s has no events", fs.Arg(0))
			}
			return printTrace(stdout, events, asJSON)
		}
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
		fmt.Fprintf(stderr, "beam mesh: unknown subcommand %q\n", sub)
		meshHelp(stderr)
		return errUsage
	}
}

// meshHelp prints the subcommands of beam mesh and how they authenticate.
func meshHelp(w io.Writer) {
	fmt.Fprintln(w, "usage: "+meshUsage)
	fmt.Fprintln(w)
	for _, sub := range []struct{ name, what string }{
		{"create", "create an envelope routed through agents (--route A,B,C --payload JSON)"},
		{"get", "print an envelope: status, progress, hop, route, headers and payload"},
		{"list", "list envelopes, newest first (--status, --parent)"},
		{"watch", "print an envelope's live events until it ends"},
		{"cancel", "cancel an envelope"},
		{"pause", "pause an envelope before its next hop"},
		{"resume", "resume a paused envelope"},
		{"trace", "print an envelope's events, as beam trace does"},
		{"dead-letters", "list the envelopes in x-sump"},
		{"requeue", "send a dead envelope again from the actor it failed at (operator)"},
	} {
		fmt.Fprintf(w, "  %-13s %s\n", sub.name, sub.what)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Each acts as an agent (--identity FILE or --api-key KEY) or as the operator (--admin-token,")
	fmt.Fprintln(w, "BEAM_ADMIN_TOKEN, or --data-dir DIR whose admin.token is used), like every operator command.")
	fmt.Fprintln(w, "Run 'beam mesh <subcommand> --help' for its flags.")
}

var meshActions = map[string]string{
	"get":     "Prints the envelope: status, progress, hop, route, headers and payload.",
	"cancel":  "Cancels the envelope; a hop in flight finishes at its actor, its answer is dropped.",
	"pause":   "Pauses the envelope before its next hop.",
	"resume":  "Resumes a paused envelope.",
	"trace":   "Prints the envelope's events in the log, as beam trace does.",
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
