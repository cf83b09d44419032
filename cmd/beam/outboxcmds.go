package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/beamdir/beam/federation"
)

// runPeerOutbox is `beam peer outbox` (the rows of a state, DEAD by
// default) and `beam peer replay ID` (an operator's replay of a DEAD or
// PUBLISHED row) against a running directory.
func runPeerOutbox(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	synopsis := map[string]string{
		"outbox": "beam peer outbox [--url URL] [--admin-token T] [--state DEAD|PENDING|CLAIMED|PUBLISHED] [--json]",
		"replay": "beam peer replay [--url URL] [--admin-token T] ROW-ID",
	}[sub]
	fs := newPlainCmdFlags("beam peer "+sub, stderr, synopsis)
	of := newOperatorFlags(fs.FlagSet)
	var state string
	var asJSON bool
	if sub == "outbox" {
		fs.StringVar(&state, "state", "DEAD", "the rows to list")
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	}
	want := map[string]int{"outbox": 0, "replay": 1}[sub]
	if err := fs.parse(args, want, want); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if sub == "replay" {
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("beam peer replay: %q is not an outbox row id (beam peer outbox lists them)", fs.Arg(0))
		}
		if _, _, err := of.call(ctx, http.MethodPost, "/federation/outbox/"+strconv.FormatInt(id, 10)+"/replay", nil, nil); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "outbox row %d is PENDING again; beam trace NONCE shows its next steps\n", id)
		return nil
	}
	data, _, err := of.call(ctx, http.MethodGet, "/federation/outbox", url.Values{"state": {state}}, nil)
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(data)
		return err
	}
	var out struct {
		Counts map[federation.OutboxState]int64 `json:"counts"`
		Rows   []federation.Row                 `json:"rows"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return errors.New("unexpected response from the directory")
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNONCE\tPEER\tSTATE\tATTEMPTS\tUPDATED\tLAST ERROR")
	for _, r := range out.Rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Nonce, r.Peer, r.State, r.Attempts,
			r.UpdatedAt.Format(time.RFC3339), r.LastError)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "outbox: %d pending, %d claimed, %d published, %d dead\n", out.Counts[federation.Pending],
		out.Counts[federation.Claimed], out.Counts[federation.Published], out.Counts[federation.Dead])
	return nil
}
