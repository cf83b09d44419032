package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// runACL is `beam acl add|list|remove`: the identity's agent manages who may
// send it intents (POST /acl, GET /acl/{beamId}, DELETE /acl/{id}),
// authenticated by the API key in its identity file.
func runACL(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	synopsis := map[string]string{
		"add":    "beam acl add [--url URL] [--identity FILE] [--intent I] [--effect allow|deny] ALLOWED_FROM",
		"list":   "beam acl list [--url URL] [--identity FILE]",
		"remove": "beam acl remove [--url URL] [--identity FILE] RULE_ID",
	}
	if len(args) == 0 || synopsis[args[0]] == "" {
		fmt.Fprintln(stderr, "usage: beam acl add|list|remove [flags]")
		fmt.Fprintln(stderr, "  add ALLOWED_FROM   let senders (*, a Beam ID, *@domain or *.suffix) send the identity's agent intents")
		fmt.Fprintln(stderr, "  list               print the agent's rules, one JSON object per line")
		fmt.Fprintln(stderr, "  remove RULE_ID     delete a rule (its id from beam acl list)")
		return errUsage
	}
	sub := args[0]
	fs := newCmdFlags("beam acl "+sub, synopsis[sub], stderr,
		"Rules are checked before the default policy; the target is always the identity's own agent.")
	af := newAgentFlags(fs.FlagSet)
	var intent, effect string
	if sub == "add" {
		fs.StringVar(&intent, "intent", "*", "intent type the rule covers, or *")
		fs.StringVar(&effect, "effect", "allow", "allow or deny")
	}
	want := map[string]int{"add": 1, "list": 0, "remove": 1}[sub]
	if err := fs.parse(args[1:], want, want); err != nil {
		return err
	}
	id, err := loadIdentity(af.identity)
	if err != nil {
		return err
	}
	if id.APIKey == "" {
		return fmt.Errorf("%s holds no API key: run beam register --identity %s first", af.identity, af.identity)
	}
	var body []byte
	switch sub {
	case "add":
		body, _, err = doJSON(ctx, af.url, id.APIKey, http.MethodPost, "/acl", nil, map[string]string{
			"targetBeamId": id.BeamID, "intentType": intent, "allowedFrom": fs.Arg(0), "effect": effect,
		})
	case "remove":
		if _, perr := strconv.ParseInt(fs.Arg(0), 10, 64); perr != nil {
			return fmt.Errorf("rule id %q is not a number: beam acl list prints the ids", fs.Arg(0))
		}
		body, _, err = doJSON(ctx, af.url, id.APIKey, http.MethodDelete, "/acl/"+fs.Arg(0), nil, nil)
	default:
		body, _, err = doJSON(ctx, af.url, id.APIKey, http.MethodGet, "/acl/"+url.PathEscape(id.BeamID), nil, nil)
		if err == nil {
			var out struct {
				ACL []json.RawMessage `json:"acl"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				return fmt.Errorf("decode rules: %w", err)
			}
			for _, r := range out.ACL {
				fmt.Fprintln(stdout, string(r))
			}
			return nil
		}
	}
	if err != nil {
		return err
	}
	_, err = stdout.Write(body)
	if err == nil && len(body) > 0 && body[len(body)-1] != '\n' {
		_, err = fmt.Fprintln(stdout)
	}
	return err
}
