package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/beamdir/beam/agents/wire"
)

// runApprove serves beam approve: the owner of an org approves a member,
// which gives it same-org rights.
func runApprove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newCmdFlags("beam approve", "beam approve [--url URL] [--identity FILE] [--revoke] MEMBER_ID", stderr,
		"Approves MEMBER_ID as a member of the identity's org, with the identity's API key: the",
		"identity must own the org (its first registrant, or made owner by an operator). Until",
		"approved, a member is outside its org for the default same-org policy. --revoke undoes it.")
	af := newAgentFlags(fs.FlagSet)
	var revoke bool
	fs.BoolVar(&revoke, "revoke", false, "return the member to pending instead")
	if err := fs.parse(args, 1, 1); err != nil {
		return err
	}
	member := strings.ToLower(strings.TrimSpace(fs.Arg(0)))
	id, err := wire.ParseBeamID(member)
	if err != nil || id.Personal() {
		return fmt.Errorf("%q is not an org member's Beam ID (name@org.beam.directory)", fs.Arg(0))
	}
	owner, err := loadIdentity(af.identity)
	if err != nil {
		return err
	}
	if owner.APIKey == "" {
		return fmt.Errorf("%s holds no API key; register it first (beam register)", af.identity)
	}
	action := "approve"
	if revoke {
		action = "revoke"
	}
	u := strings.TrimRight(af.url, "/") + "/orgs/" + url.PathEscape(id.Org) + "/members/" + url.PathEscape(member) + "/" + action
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	req.Header.Set("X-Api-Key", owner.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("approve: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("approve %s: HTTP %d: %s", member, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	fmt.Fprintln(stdout, strings.TrimSpace(string(body)))
	return nil
}
