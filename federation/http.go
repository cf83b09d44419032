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

func (n *Node) operator(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if n.cfg.OperatorAuth == nil || !n.cfg.OperatorAuth(r) {
			writeErr(w, http.StatusUnauthorized, "UNAUTHORIZED", "operator token required")
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	httpjson.Error(w, status, code, msg)
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

func (n *Node) handleSelf(w http.ResponseWriter, _ *http.Request) {
	nk, _ := NkeyUser(n.self.PublicKey)
	writeJSON(w, http.StatusOK, map[string]string{
		"domain": n.cfg.Domain, "line": n.self.Line(), "natsUrl": n.self.URL,
		"publicKey": EncodeKey(n.self.PublicKey), "nkey": nk,
	})
}

func (n *Node) handlePeers(w http.ResponseWriter, _ *http.Request) {
	peers := n.Peers()
	out := make([]PeerView, 0, len(peers))
	for _, p := range peers {
		out = append(out, viewOf(p))
	}
	writeJSON(w, http.StatusOK, map[string]any{"peers": out})
}

func (n *Node) handleAddPeer(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		writeErr(w, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "body exceeds 4096 bytes")
		return
	}
	var req struct {
		Line string `json:"line"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeErr(w, http.StatusBadRequest, "INVALID_JSON", "body must be {\"line\": \"DOMAIN=nats://HOST:PORT#KEY\"}")
		return
	}
	p, err := ParsePeerLine(req.Line)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "INVALID_PEER", err.Error())
		return
	}
	if err := n.AddPeer(r.Context(), p); err != nil {
		writeErr(w, http.StatusBadRequest, "INVALID_PEER", err.Error())
		return
	}
	for _, q := range n.Peers() {
		if q.Domain == p.Domain {
			writeJSON(w, http.StatusCreated, viewOf(q))
			return
		}
	}
	writeJSON(w, http.StatusCreated, viewOf(p))
}

func (n *Node) handleRemovePeer(w http.ResponseWriter, r *http.Request) {
	ok, err := n.RemovePeer(r.Context(), r.PathValue("domain"))
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "INTERNAL_ERROR", err.Error())
		return
	}
	if !ok {
		writeErr(w, http.StatusNotFound, "NOT_FOUND", "no such peer")
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"removed": true})
}

func (n *Node) handleOutbox(w http.ResponseWriter, r *http.Request) {
	counts, err := n.outbox.Counts(r.Context())
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "INTERNAL_ERROR", err.Error())
		return
	}
	state := OutboxState(r.URL.Query().Get("state"))
	if state == "" {
		state = Dead
	}
	if !CanTransitionOutbox(state, Pending) && state != Pending && state != Claimed {
		writeErr(w, http.StatusBadRequest, "INVALID_STATE", "state must be PENDING, CLAIMED, PUBLISHED or DEAD")
		return
	}
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit <= 0 || limit > 500 {
		limit = 100
	}
	rows, err := n.outbox.Rows(r.Context(), state, limit)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, "INTERNAL_ERROR", err.Error())
		return
	}
	if rows == nil {
		rows = []Row{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"counts": counts, "state": state, "rows": rows})
}

func (n *Node) handleReplay(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "INVALID_ID", "id must be an integer")
		return
	}
	err = n.outbox.Replay(r.Context(), id)
	var te *OutboxTransitionError
	switch {
	case errors.Is(err, ErrRowNotFound):
		writeErr(w, http.StatusNotFound, "NOT_FOUND", "no such outbox row")
		return
	case errors.As(err, &te):
		writeErr(w, http.StatusConflict, "INVALID_TRANSITION", te.Error())
		return
	case errors.Is(err, ErrIntentFinished):
		writeErr(w, http.StatusConflict, "INTENT_FINISHED", "outbox row "+strconv.FormatInt(id, 10)+": "+err.Error())
		return
	case err != nil:
		writeErr(w, http.StatusInternalServerError, "INTERNAL_ERROR", err.Error())
		return
	}
	n.Kick()
	writeJSON(w, http.StatusOK, map[string]any{"replayed": id})
}
