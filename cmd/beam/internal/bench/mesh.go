package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// modeMesh creates pipeline envelopes (POST /api/v1/mesh) routed through
// Config.Hops recipients and waits on each envelope's SSE stream until it
// succeeds. One "intent" of the summary is one envelope.
const modeMesh Mode = "mesh"

// defaultHops is the route length of a mesh run.
const defaultHops = 3

// meshDriver sends envelopes for modeMesh.
type meshDriver struct {
	env  *env
	hops int
}

func newMeshDriver(ctx context.Context, env *env) (driver, error) {
	hops := env.Config.Hops
	if hops <= 0 {
		hops = defaultHops
	}
	if len(env.Fleet.Recipients) == 0 {
		return nil, fmt.Errorf("mesh: no recipients")
	}
	for _, a := range append(slices.Clip(env.Fleet.Senders), env.Fleet.Recipients...) {
		if a.Pending {
			return nil, fmt.Errorf("mesh: the directory made %s a pending member of org %s, and pipeline hops "+
				"between unapproved members fail: start beam serve with --open-orgs, as beam bench's own server does", a.BeamID, env.Fleet.Org)
		}
	}
	return &meshDriver{env: env, hops: hops}, nil
}

func (d *meshDriver) Close() error { return nil }

// Send creates one envelope whose route starts at to and continues through
// the following recipients, and waits until it ends.
func (d *meshDriver) Send(ctx context.Context, from, to *agent) error {
	rs := d.env.Fleet.Recipients
	first := 0
	for i, r := range rs {
		if r == to {
			first = i
		}
	}
	route := make([]string, d.hops)
	for i := range route {
		route[i] = rs[(first+i)%len(rs)].BeamID
	}
	body, err := json.Marshal(map[string]any{"route": route, "payload": d.env.Config.payload()})
	if err != nil {
		return err
	}
	hdr := http.Header{"X-Api-Key": {from.APIKey}, "Content-Type": {"application/json"}}
	_, b, err := call(ctx, d.env.HTTP, http.MethodPost, from.Base+"/api/v1/mesh", body, hdr, http.StatusCreated)
	if err != nil {
		return err
	}
	id := receiptID(b)
	if id == "" {
		return failure("BAD_RECEIPT", "create answered %.200q", b)
	}
	return d.await(ctx, from, id)
}

// await reads the envelope's event stream until a terminal status.
func (d *meshDriver) await(ctx context.Context, from *agent, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, from.Base+"/api/v1/mesh/"+url.PathEscape(id)+"/events", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Api-Key", from.APIKey)
	resp, err := d.env.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return failure(fmt.Sprintf("HTTP_%d", resp.StatusCode), "events of %s", id)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[7:])
		case event == "status" && bytes.HasPrefix(line, []byte("data: ")):
			var st struct {
				Status string `json:"status"`
				Error  string `json:"error"`
			}
			if err := json.Unmarshal(line[6:], &st); err != nil {
				return failure("BAD_EVENT", "envelope %s: %v", id, err)
			}
			switch st.Status {
			case "succeeded":
				return nil
			case "failed", "canceled":
				return failure(strings.ToUpper(st.Status), "envelope %s: %s", id, st.Error)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return failure("STREAM_CLOSED", "envelope %s: the event stream closed before a terminal status", id)
}
