package federation

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
)

// Routes registers the operator API (every route requires
// Config.OperatorAuth):
//
//	GET    /federation/self                 this directory's domain, peer line and keys
//	GET    /federation/peers                pinned peers and their last contact
//	POST   /federation/peers                pin a peer: {"line": "DOMAIN=nats://HOST:PORT#KEY"}
//	DELETE /federation/peers/{domain}       unpin a peer
//	GET    /federation/outbox               counts by state and the dead rows (?state=S for other rows)
//	POST   /federation/outbox/{id}/replay   PUBLISHED or DEAD → PENDING
func (n *Node) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /federation/self", n.operator(n.handleSelf))
	mux.HandleFunc("GET /federation/peers", n.operator(n.handlePeers))
	mux.HandleFunc("POST /federation/peers", n.operator(n.handleAddPeer))
	mux.HandleFunc("DELETE /federation/peers/{domain}", n.operator(n.handleRemovePeer))
	mux.HandleFunc("GET /federation/outbox", n.operator(n.handleOutbox))
	mux.HandleFunc("POST /federation/outbox/{id}/replay", n.operator(n.handleReplay))
}

// operator serves h through the httpjson adapter to the operator only.
func (n *Node) operator(h httpjson.HandlerFunc) http.HandlerFunc {
	return httpjson.Adapter{Log: n.lg}.Handler(func(w http.ResponseWriter, r *http.Request) error {
		if n.cfg.OperatorAuth == nil || !n.cfg.OperatorAuth(r) {
			return httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "operator token required")
		}
		return h(w, r)
	})
}

// PeerView is a peer as the operator API shows it.
type PeerView struct {
	Domain      string    `json:"domain"`
	URL         string    `json:"url"`
	PublicKey   string    `json:"publicKey"`
	Line        string    `json:"line"`
	AddedAt     time.Time `json:"addedAt"`
	LastContact time.Time `json:"lastContact,omitzero"`
}

func viewOf(p Peer) PeerView {
	return PeerView{Domain: p.Domain, URL: p.URL, PublicKey: EncodeKey(p.PublicKey), Line: p.Line(),
		AddedAt: p.AddedAt, LastContact: p.LastContact}
}

func (n *Node) handleSelf(w http.ResponseWriter, _ *http.Request) error {
	nk, _ := NkeyUser(n.self.PublicKey)
	httpjson.Write(w, http.StatusOK, map[string]string{
		"domain": n.cfg.Domain, "line": n.self.Line(), "natsUrl": n.self.URL,
		"publicKey": EncodeKey(n.self.PublicKey), "nkey": nk,
	})
	return nil
}

func (n *Node) handlePeers(w http.ResponseWriter, _ *http.Request) error {
	peers := n.Peers()
	out := make([]PeerView, 0, len(peers))
	for _, p := range peers {
		out = append(out, viewOf(p))
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"peers": out})
	return nil
}

func (n *Node) handleAddPeer(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		return httpjson.New(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "body exceeds 4096 bytes")
	}
	var req struct {
		Line string `json:"line"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_JSON", "body must be {\"line\": \"DOMAIN=nats://HOST:PORT#KEY\"}")
	}
	p, err := ParsePeerLine(req.Line)
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_PEER", err.Error())
	}
	if err := n.AddPeer(r.Context(), p); err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_PEER", err.Error())
	}
	for _, q := range n.Peers() {
		if q.Domain == p.Domain {
			httpjson.Write(w, http.StatusCreated, viewOf(q))
			return nil
		}
	}
	httpjson.Write(w, http.StatusCreated, viewOf(p))
	return nil
}

func (n *Node) handleRemovePeer(w http.ResponseWriter, r *http.Request) error {
	ok, err := n.RemovePeer(r.Context(), r.PathValue("domain"))
	if err != nil {
		return httpjson.Internal("remove peer failed", err)
	}
	if !ok {
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such peer")
	}
	httpjson.Write(w, http.StatusOK, map[string]bool{"removed": true})
	return nil
}

func (n *Node) handleOutbox(w http.ResponseWriter, r *http.Request) error {
	counts, err := n.outbox.Counts(r.Context())
	if err != nil {
		return httpjson.Internal("read outbox failed", err)
	}
	state := OutboxState(r.URL.Query().Get("state"))
	if state == "" {
		state = Dead
	}
	if !canTransitionOutbox(state, Pending) && state != Pending && state != Claimed {
		return httpjson.New(http.StatusBadRequest, "INVALID_STATE", "state must be PENDING, CLAIMED, PUBLISHED or DEAD")
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit <= 0 || limit > 500 {
		limit = 100
	}
	rows, err := n.outbox.Rows(r.Context(), state, limit)
	if err != nil {
		return httpjson.Internal("read outbox failed", err)
	}
	if rows == nil {
		rows = []Row{}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"counts": counts, "state": state, "rows": rows})
	return nil
}

func (n *Node) handleReplay(w http.ResponseWriter, r *http.Request) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return httpjson.New(http.StatusBadRequest, "INVALID_ID", "id must be an integer")
	}
	err = n.outbox.Replay(r.Context(), id)
	var te *outboxTransitionError
	switch {
	case errors.Is(err, errRowNotFound):
		return httpjson.New(http.StatusNotFound, "NOT_FOUND", "no such outbox row")
	case errors.As(err, &te):
		return httpjson.New(http.StatusConflict, "INVALID_TRANSITION", te.Error())
	case errors.Is(err, errIntentFinished):
		return httpjson.New(http.StatusConflict, "INTENT_FINISHED", "outbox row "+strconv.FormatInt(id, 10)+": "+err.Error())
	case err != nil:
		return httpjson.Internal("replay failed", err)
	}
	n.Kick()
	httpjson.Write(w, http.StatusOK, map[string]any{"replayed": id})
	return nil
}
