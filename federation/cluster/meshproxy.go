package cluster

import (
	"bytes"
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
)

// Pipelines across nodes: an envelope belongs to the node that created it
// (its log), and its creator or the operator may reach it through any
// node. The forwarding node authenticates the client once (the pipeline
// gateway's own authentication: API key, signed request, operator token;
// MeshAuth), serves the request itself as that principal and, when it does
// not know the envelope (404 NOT_FOUND), asks the other live nodes in turn
// with node calls (busproxy.go) carrying the principal; the first that
// knows it answers. A list asks every live node and merges their answers.
// The event stream is forwarded as a stream (stream.go). Creation stays on
// the node that receives it.

// meshPrefix is the pipeline gateway's path.
const meshPrefix = "/api/v1/mesh"

// maxMergeDepth is how deep (offset + limit) a merged list reaches: each
// node is asked for its first maxMergeDepth envelopes at most, one page.
const maxMergeDepth = 500

// meshKind is how the cluster handles a gateway request.
type meshKind int

const (
	meshLocal  meshKind = iota // this node only (create, or not a gateway route)
	meshByID                   // this node, then the first other node that knows the ID
	meshList                   // every live node, merged
	meshEvents                 // the event stream, forwarded as a stream
)

// meshRoute classifies a gateway request.
func meshRoute(method, path string) meshKind {
	rest, ok := strings.CutPrefix(path, meshPrefix)
	if !ok {
		return meshLocal
	}
	if rest == "" || rest == "/" || rest == "/dead-letters" {
		if method == http.MethodGet {
			return meshList
		}
		return meshLocal
	}
	id, action, _ := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
	if id == "" || !strings.HasPrefix(rest, "/") || strings.Contains(action, "/") {
		return meshLocal
	}
	switch {
	case action == "" && (method == http.MethodGet || method == http.MethodDelete),
		action == "trace" && method == http.MethodGet:
		return meshByID
	case action == "events" && method == http.MethodGet:
		return meshEvents
	case method == http.MethodPost:
		switch action {
		case "cancel", "pause", "resume", "requeue", "fly", "processing":
			return meshByID
		}
	}
	return meshLocal
}

// MeshAuth sets who a pipeline gateway request's credentials authenticate
// (mesh.Engine.Principal); until it is set, gateway requests stay on the
// node that receives them.
func (n *Node) MeshAuth(auth func(*http.Request) (directory.BusPrincipal, bool)) {
	n.meshAuth.Store(&auth)
}

// meshCall answers a gateway request that may concern another node's
// envelopes: kind says how.
func (n *Node) meshCall(w http.ResponseWriter, r *http.Request, next http.Handler, kind meshKind) {
	auth := n.meshAuth.Load()
	if auth == nil {
		next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxForwardBody))
	if err != nil {
		httpjson.WriteError(w, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "body too large or unreadable")
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	p, ok := (*auth)(r)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !ok {
		// The gateway answers the refusal in its own words.
		next.ServeHTTP(w, r)
		return
	}
	// Authenticated once: a signed request's nonce is spent, so this
	// node serves it as the principal too.
	r = r.WithContext(directory.WithBusPrincipal(r.Context(), p))
	switch kind {
	case meshList:
		n.meshListAll(w, r, next, p)
	case meshEvents:
		n.meshStream(w, r, next, p)
	default:
		n.meshFirstKnown(w, r, next, p, body)
	}
}

// meshNotFound reports whether an answer says the node does not know the
// envelope (or does not show it to the principal).
func meshNotFound(status int, body []byte) bool {
	return status == http.StatusNotFound && bytes.Contains(body, []byte(`"NOT_FOUND"`))
}

// meshFirstKnown answers from this node or the first other node that knows
// the envelope.
func (n *Node) meshFirstKnown(w http.ResponseWriter, r *http.Request, next http.Handler, p directory.BusPrincipal, body []byte) {
	rec := serveCaptured(next, r)
	if rec.overflow || !meshNotFound(rec.code(), rec.body) {
		rec.copyTo(w)
		return
	}
	for _, node := range n.others(r.Context()) {
		status, hdr, rb, err := n.forward(r.Context(), r, node, p, r.URL.RawQuery, body)
		if err != nil {
			n.lg.Warn("mesh: ask another node", "node", node.NodeID, "err", err)
			continue
		}
		if meshNotFound(status, rb) {
			continue
		}
		writeAnswer(w, status, hdr, rb)
		return
	}
	rec.copyTo(w)
}

// writeAnswer writes another node's answer.
func writeAnswer(w http.ResponseWriter, status int, hdr http.Header, body []byte) {
	for k, v := range hdr {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// meshPage is a list answer of the gateway.
type meshPage struct {
	Messages []json.RawMessage `json:"messages"`
	Total    int               `json:"total"`
}

// meshListed is what the merge reads of a listed envelope: the gateway's
// order (newest first, then the ID, descending).
type meshListed struct {
	ID        string `json:"id"`
	CreatedAt int64  `json:"createdAt"`
	raw       json.RawMessage
}

// meshListAll answers a list with every live node's envelopes: each node
// is asked for its first offset+limit envelopes (offset 0), the answers
// are merged in the gateway's order and the page is cut from the merge,
// so the page is the one a single node holding every envelope would give;
// total is the sum of the nodes' totals. A node that does not answer is
// left out and named in unreachableNodes.
func (n *Node) meshListAll(w http.ResponseWriter, r *http.Request, next http.Handler, p directory.BusPrincipal) {
	q := r.URL.Query()
	limit, offset := 100, 0
	for name, dst := range map[string]*int{"limit": &limit, "offset": &offset} {
		if v := q.Get(name); v != "" {
			x, err := strconv.Atoi(v)
			if err != nil || x < 0 {
				next.ServeHTTP(w, r) // the gateway refuses it in its own words
				return
			}
			*dst = x
		}
	}
	if limit == 0 {
		limit = 100
	}
	if offset+limit > maxMergeDepth {
		httpjson.WriteError(w, http.StatusBadRequest, "INVALID_FIELD",
			"in cluster mode a list reaches "+strconv.Itoa(maxMergeDepth)+" envelopes deep at most (offset + limit); narrow it with status, creator or parent")
		return
	}
	q.Set("offset", "0")
	q.Set("limit", strconv.Itoa(offset+limit))
	query := q.Encode()
	lr := r.Clone(r.Context())
	lr.URL.RawQuery = query
	rec := serveCaptured(next, lr)
	var merged meshPage
	if rec.overflow || rec.code() != http.StatusOK || json.Unmarshal(rec.body, &merged) != nil {
		rec.copyTo(w)
		return
	}
	var unreachable []string
	for _, node := range n.others(r.Context()) {
		status, _, body, err := n.forward(r.Context(), r, node, p, query, nil)
		var page meshPage
		if err != nil || status != http.StatusOK || json.Unmarshal(body, &page) != nil {
			n.lg.Warn("mesh: list another node", "node", node.NodeID, "status", status, "err", err)
			unreachable = append(unreachable, node.NodeID)
			continue
		}
		merged.Messages = append(merged.Messages, page.Messages...)
		merged.Total += page.Total
	}
	items := make([]meshListed, len(merged.Messages))
	for i, m := range merged.Messages {
		_ = json.Unmarshal(m, &items[i])
		items[i].raw = m
	}
	slices.SortStableFunc(items, func(a, b meshListed) int {
		return cmp.Or(cmp.Compare(b.CreatedAt, a.CreatedAt), strings.Compare(b.ID, a.ID))
	})
	page := make([]json.RawMessage, 0, limit)
	for _, it := range items[min(offset, len(items)):min(offset+limit, len(items))] {
		page = append(page, it.raw)
	}
	out := map[string]any{"messages": page, "total": merged.Total}
	if len(unreachable) > 0 {
		out["unreachableNodes"] = unreachable
	}
	httpjson.Write(w, http.StatusOK, out)
}
