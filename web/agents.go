package web

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/tracing"
)

// policySummary sums up the ACL rules that protect an agent.
type policySummary struct {
	Rules       int      `json:"rules"`
	Allow       int      `json:"allow"`
	Deny        int      `json:"deny"`
	IntentTypes []string `json:"intentTypes"`
	Summary     string   `json:"summary"`
}

type agentView struct {
	BeamID           string        `json:"beamId"`
	DisplayName      string        `json:"displayName"`
	Org              string        `json:"org"`
	Personal         bool          `json:"personal"`
	Capabilities     []string      `json:"capabilities"`
	Visibility       string        `json:"visibility"`
	Verified         bool          `json:"verified"`
	VerificationTier string        `json:"verificationTier"`
	Delivery         string        `json:"delivery"` // ws or direct-http
	Connected        bool          `json:"connected"`
	CreatedAt        string        `json:"createdAt"`
	LastSeen         *string       `json:"lastSeen"`
	TrustScore       float64       `json:"trustScore"`
	Policy           policySummary `json:"policy"`
	// Inbox counts the bus messages waiting for the agent.
	Inbox tracing.InboxDepth `json:"inbox"`
}

type agentsResponse struct {
	Agents     []agentView `json:"agents"`
	Total      int64       `json:"total"`
	Registered int         `json:"registered"`
	Connected  int         `json:"connected"`
	Limit      int         `json:"limit"`
	Offset     int         `json:"offset"`
}

const maxPolicyTypes = 5

func (d *Dashboard) handleAgents(w http.ResponseWriter, r *http.Request, _ principal) error {
	q := r.URL.Query()
	search, err := param(q, "q")
	var limit, offset int
	if err == nil {
		limit, err = intParam(q, "limit", 200, 1, 1000)
	}
	if err == nil {
		offset, err = intParam(q, "offset", 0, 0, maxOffset)
	}
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	onlyConnected := q.Get("connected") == "1" || q.Get("connected") == "true"
	resp := agentsResponse{Agents: []agentView{}, Registered: d.reg.Count(), Connected: d.dir.ConnectedAgents(), Limit: limit, Offset: offset}
	ids := d.reg.Find(search)
	if onlyConnected {
		ids = slices.DeleteFunc(ids, func(id string) bool { return !d.dir.Online(id) })
	}
	resp.Total = int64(len(ids))
	ids = ids[min(offset, len(ids)):]
	ids = ids[:min(limit, len(ids))]
	now := d.clock()
	inbox, err := d.log.InboxDepths(r.Context(), ids)
	if err != nil {
		return httpjson.Internal("agents failed", err)
	}
	for _, id := range ids {
		a, ok := d.reg.Get(id)
		if !ok {
			continue // deleted since the query
		}
		v := agentView{
			BeamID: a.BeamID, DisplayName: a.DisplayName, Org: a.Org, Personal: a.Personal,
			Capabilities: append([]string{}, a.Capabilities...), Visibility: a.Visibility, Verified: a.Verified,
			VerificationTier: a.VerificationTier, Delivery: "ws", Connected: d.dir.Online(a.BeamID),
			CreatedAt: isoTime(a.CreatedAt), TrustScore: a.TrustScore(now),
		}
		if a.HTTPEndpoint != "" {
			v.Delivery = "direct-http"
		}
		if !a.LastSeen.IsZero() {
			s := isoTime(a.LastSeen)
			v.LastSeen = &s
		}
		v.Policy = d.policyOf(a.BeamID)
		v.Inbox = inbox[a.BeamID]
		resp.Agents = append(resp.Agents, v)
	}
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}

func (d *Dashboard) policyOf(beamID string) policySummary {
	rules := d.reg.Rules(beamID)
	p := policySummary{Rules: len(rules), IntentTypes: []string{}}
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Effect == "deny" {
			p.Deny++
		} else {
			p.Allow++
		}
		if !seen[r.IntentType] && len(p.IntentTypes) < maxPolicyTypes {
			seen[r.IntentType] = true
			p.IntentTypes = append(p.IntentTypes, r.IntentType)
		}
	}
	switch {
	case len(rules) == 0:
		p.Summary = "Directory default policy"
	case p.Deny == 0:
		p.Summary = fmt.Sprintf("%d allow rule%s", p.Allow, plural(p.Allow))
	case p.Allow == 0:
		p.Summary = fmt.Sprintf("%d deny rule%s", p.Deny, plural(p.Deny))
	default:
		p.Summary = fmt.Sprintf("%d allow, %d deny", p.Allow, p.Deny)
	}
	return p
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Errors endpoint.

type errorCode struct {
	ErrorCode          string   `json:"errorCode"`
	Count              int64    `json:"count"`
	LastSeenAt         string   `json:"lastSeenAt"`
	AvgLatencyMs       *float64 `json:"avgLatencyMs"`
	AffectedSenders    int      `json:"affectedSenders"`
	AffectedRecipients int      `json:"affectedRecipients"`
	lastUs             int64
	latSum, latN       int64
	senders, recips    map[string]struct{}
}

type errorRoute struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Count int64  `json:"count"`
}

type errorBucket struct {
	BucketStart string `json:"bucketStart"`
	Errors      int64  `json:"errors"`
}

type errorsResponse struct {
	WindowHours float64 `json:"windowHours"`
	Summary     struct {
		TotalErrors         int64 `json:"totalErrors"`
		DistinctErrorCodes  int   `json:"distinctErrorCodes"`
		TimeoutCount        int64 `json:"timeoutCount"`
		OfflineCount        int64 `json:"offlineCount"`
		DeliveryFailedCount int64 `json:"deliveryFailedCount"`
		DeadLetterCount     int64 `json:"deadLetterCount"`
	} `json:"summary"`
	Timeline []errorBucket `json:"timeline"`
	Codes    []*errorCode  `json:"codes"`
	Routes   []errorRoute  `json:"routes"`
}

const maxAffected = 1000

func (d *Dashboard) handleErrors(w http.ResponseWriter, r *http.Request, _ principal) error {
	hours, err := hoursParam(r.URL.Query(), defaultWindowHours)
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_QUERY", err.Error())
	}
	now := d.clock().UTC()
	window := time.Duration(hours * float64(time.Hour))
	start := now.Add(-window)
	size := bucketSize(window)
	first := start.Truncate(size)
	resp := errorsResponse{WindowHours: hours, Codes: []*errorCode{}, Routes: []errorRoute{}}
	for t := first; !t.After(now); t = t.Add(size) {
		resp.Timeline = append(resp.Timeline, errorBucket{BucketStart: isoTime(t)})
	}
	codes := map[string]*errorCode{}
	routes := map[[2]string]int64{}
	err = d.log.EachIntent(r.Context(), tracing.IntentQuery{Since: start, Until: now,
		Statuses: []tracing.State{tracing.Failed, tracing.DeadLetter}}, func(row *tracing.IntentRow) error {
		at, status, code, lat, from, to := row.RequestedAt, row.Status, row.ErrorCode, row.RoundTripLatencyMs, row.From, row.To
		s := &resp.Summary
		s.TotalErrors++
		if status == tracing.DeadLetter {
			s.DeadLetterCount++
		}
		switch code {
		case "TIMEOUT":
			s.TimeoutCount++
		case "OFFLINE":
			s.OfflineCount++
		case "DELIVERY_FAILED":
			s.DeliveryFailedCount++
		}
		if idx := int(time.UnixMicro(at).Sub(first) / size); idx >= 0 && idx < len(resp.Timeline) {
			resp.Timeline[idx].Errors++
		}
		if code == "" {
			code = "UNKNOWN"
		}
		c := codes[code]
		if c == nil && len(codes) < maxGroupKeys {
			c = &errorCode{ErrorCode: code, senders: map[string]struct{}{}, recips: map[string]struct{}{}}
			codes[code] = c
		}
		if c != nil {
			c.Count++
			c.lastUs = max(c.lastUs, at)
			if lat != nil {
				c.latSum += *lat
				c.latN++
			}
			if len(c.senders) < maxAffected {
				c.senders[from] = struct{}{}
			}
			if len(c.recips) < maxAffected {
				c.recips[to] = struct{}{}
			}
		}
		k := [2]string{from, to}
		if _, ok := routes[k]; ok || len(routes) < maxGroupKeys {
			routes[k]++
		}
		return nil
	})
	if err != nil {
		return httpjson.Internal("read errors failed", err)
	}
	for _, c := range codes {
		c.LastSeenAt = isoMicros(c.lastUs)
		c.AffectedSenders, c.AffectedRecipients = len(c.senders), len(c.recips)
		if c.latN > 0 {
			avg := float64(c.latSum) / float64(c.latN)
			c.AvgLatencyMs = &avg
		}
		resp.Codes = append(resp.Codes, c)
	}
	resp.Summary.DistinctErrorCodes = len(codes)
	sort.Slice(resp.Codes, func(i, j int) bool {
		if resp.Codes[i].Count != resp.Codes[j].Count {
			return resp.Codes[i].Count > resp.Codes[j].Count
		}
		return resp.Codes[i].ErrorCode < resp.Codes[j].ErrorCode
	})
	for k, n := range routes {
		resp.Routes = append(resp.Routes, errorRoute{From: k[0], To: k[1], Count: n})
	}
	sort.Slice(resp.Routes, func(i, j int) bool {
		a, b := resp.Routes[i], resp.Routes[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return strings.Compare(a.From+" "+a.To, b.From+" "+b.To) < 0
	})
	resp.Routes = resp.Routes[:min(10, len(resp.Routes))]
	httpjson.Write(w, http.StatusOK, resp)
	return nil
}
