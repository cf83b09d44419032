package cluster

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/beamdir/beam/agents/wire"
)

// Membership is proven with the directory key every node of a cluster
// holds (identity.go): what a node writes for the others — registry stream
// entries, its entries in the nodes, sessions and delivered buckets, the
// intents it hands over (routing.go) and the bus requests it forwards
// (busproxy.go) — is a compact JWS (EdDSA, agents/wire) by that key,
// with the writing node's ID as kid and a typ per purpose, so one kind of
// token never passes for another. A NATS client that may publish on the
// cluster's subjects or write its buckets but does not hold the key cannot
// forge any of them; what does not verify is ignored and counted.

// The typ of each kind of sealed token.
const (
	typRegistryEntry = "beam-cluster-registry+jws"
	typNodeEntry     = "beam-cluster-node+jws"
	typNodeCall      = "beam-cluster-call+jws"
	typHandOver      = "beam-cluster-handover+jws"
	typSession       = "beam-cluster-session+jws"
	typDelivery      = "beam-cluster-delivery+jws"
	typNonce         = "beam-cluster-nonce+jws"
	typCallReply     = "beam-cluster-answer+jws"
	typLogBatch      = "beam-cluster-log-batch+jws"
	typLogFence      = "beam-cluster-log-fence+jws"
	typTakeover      = "beam-cluster-takeover+jws"
)

// headerSeal carries the sealed digest of a hand-over request's data, a
// bus call's token and its answer's seal (a NATS message header), so that
// data of any size is covered without growing it.
const headerSeal = "Beam-Cluster-Seal"

// handSeal is the payload of headerSeal: the receiving node, an expiry
// and the digest of the request's data.
type handSeal struct {
	To     string `json:"to"`
	Exp    int64  `json:"exp"` // Unix seconds
	Digest string `json:"digest"`
}

// seal signs v's JSON as a token of typ by this node.
func (n *Node) seal(typ string, v any) (string, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("cluster: seal %s: %w", typ, err)
	}
	tok, err := wire.SignJWS(typ, payload, n.cfg.NodeID, n.cfg.Key)
	if err != nil {
		return "", fmt.Errorf("cluster: seal %s: %w", typ, err)
	}
	return tok, nil
}

// errUnsealed is the error of a token that is not a member's.
var errUnsealed = errors.New("cluster: not signed by the cluster's directory key")

// open verifies token as a token of typ by a member of the cluster and
// returns the signing node's ID and the payload.
func (n *Node) open(typ string, token []byte) (string, []byte, error) {
	pub := n.cfg.Key.Public().(ed25519.PublicKey)
	payload, kid, err := wire.VerifyJWS(string(token), typ, func(string) (ed25519.PublicKey, error) { return pub, nil })
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", errUnsealed, err)
	}
	if err := validNodeID(kid); err != nil {
		return "", nil, fmt.Errorf("%w: %w", errUnsealed, err)
	}
	return kid, payload, nil
}

// openAs verifies token as a token of typ, decodes its payload into v and
// checks that the node v names (signer, read after decoding) signed it.
func (n *Node) openAs(typ string, token []byte, v any, signer func() string) error {
	from, payload, err := n.open(typ, token)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("cluster: %s of %s: %w", typ, from, err)
	}
	if named := signer(); named != from {
		return fmt.Errorf("%w: %s of %s signed as %s", errUnsealed, typ, named, from)
	}
	return nil
}

// refuse logs and counts something of kind the node did not take.
func (n *Node) refuse(kind string, err error, args ...any) {
	n.rejected.inc(kind)
	n.lg.Warn("refused "+kind+" not signed by a member of the cluster", append(args, "err", err)...)
}

// registryEntry is the payload of a registry stream entry: the operation
// and the stream position it was validated at, so that the entry applies
// only at the position after it (a copy published again lands elsewhere
// and is refused).
type registryEntry struct {
	After uint64          `json:"after"`
	Op    json.RawMessage `json:"op"`
}

// openEntry verifies the registry stream entry at seq and returns its
// operation: signed by a member, and published right after the position
// its origin validated it at.
func (n *Node) openEntry(seq uint64, data []byte) ([]byte, error) {
	node, payload, err := n.open(typRegistryEntry, data)
	if err != nil {
		return nil, err
	}
	var e registryEntry
	if err := json.Unmarshal(payload, &e); err != nil {
		return nil, fmt.Errorf("cluster: registry entry of %s: %w", node, err)
	}
	if e.After+1 != seq {
		return nil, fmt.Errorf("cluster: registry entry of %s validated after %d is at %d: a copy", node, e.After, seq)
	}
	return e.Op, nil
}

// rejected counts what the node refused from the cluster's buckets and
// from other nodes, by kind (node, session, delivery, nonce, handover, stream,
// call, answer, log, takeover);
// registry entries skipped are
// the registry's count (registry.Registry.Rejected).
type rejected struct{ c *prometheus.CounterVec }

func newRejected(reg prometheus.Registerer, skipped func() uint64) (rejected, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "beam_cluster_rejected_total",
		Help: "Node, session and delivery entries, hand-overs, node requests, log stream messages and takeover records refused: not signed by the cluster's directory key, or not valid.",
	}, []string{"kind"})
	registry := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "beam_cluster_registry_skipped_total",
		Help: "Registry stream entries skipped: not signed by the cluster's directory key, out of place, or not a valid operation.",
	}, func() float64 { return float64(skipped()) })
	if reg != nil {
		for _, col := range []prometheus.Collector{c, registry} {
			if err := reg.Register(col); err != nil {
				return rejected{}, fmt.Errorf("cluster: register metrics: %w", err)
			}
		}
	}
	return rejected{c: c}, nil
}

func (r rejected) inc(kind string) { r.c.WithLabelValues(kind).Inc() }
