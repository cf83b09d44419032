package tracing

import (
	"context"
	"errors"
	"fmt"
)

// A takeover imports a dead node's log into this one: every imported event
// carries details.takenOver ({"log","node","seq"}: where it came from).
// The subsystems then adopt the imported items that were unfinished, and
// each adopted item gets one event of this log with transport
// TransportTakeover (its marker), whose details.extra.adoptedFrom names
// the log and node it was taken over from.

// TransportTakeover is the transport of the event that marks an item
// adopted after a takeover.
const TransportTakeover = "takeover"

// Takeover is where an imported event came from (details.takenOver).
type Takeover struct {
	Log  string `json:"log,omitempty"`
	Node string `json:"node,omitempty"`
}

// takeoverOf returns details.takenOver of an event; ok false for an event
// this log wrote itself.
func takeoverOf(d Details) (Takeover, bool) {
	m, ok := d.Extra["takenOver"].(map[string]any)
	if !ok {
		return Takeover{}, false
	}
	var t Takeover
	t.Log, _ = m["log"].(string)
	t.Node, _ = m["node"].(string)
	return t, true
}

// Marker returns extra with adoptedFrom set to t: the details.extra of an
// adopted item's marker event.
func (t Takeover) Marker(extra map[string]any) map[string]any {
	out := make(map[string]any, len(extra)+1)
	for k, v := range extra {
		out[k] = v
	}
	from := map[string]any{}
	if t.Log != "" {
		from["log"] = t.Log
	}
	if t.Node != "" {
		from["node"] = t.Node
	}
	out["adoptedFrom"] = from
	return out
}

// Adoptable reports whether nonce's latest event is an imported one
// (details.takenOver), and where it came from: nothing of this node has
// touched the item since the import, so it is still to be adopted. An item
// this node already adopted (its marker is newer) or drives is not.
func (l *Log) Adoptable(ctx context.Context, nonce string) (Takeover, bool, error) {
	ok, err := l.HasNonce(ctx, nonce)
	if err != nil || !ok {
		return Takeover{}, false, err
	}
	d, err := l.LastDetails(ctx, nonce)
	if err != nil {
		return Takeover{}, false, err
	}
	t, ok := takeoverOf(d)
	return t, ok, nil
}

// Imported reports whether this log has imported another log (a
// takeover): only then may an item's latest event be an imported one that
// is still to be adopted (Adoptable). A log that never imported answers
// without reading anything.
func (l *Log) Imported() bool { return l.imported.Load() }

// Unadopted reports whether nonce's latest event is an imported one that
// no subsystem adopted yet: while a takeover imports a lost log's batches,
// and until it adopts their work, the item belongs to the takeover, and a
// subsystem that drives its items from the log (due hops, deadlines)
// leaves it alone, or it would run work the rest of the import may show
// done.
func (l *Log) Unadopted(ctx context.Context, nonce string) (bool, error) {
	if !l.Imported() {
		return false, nil
	}
	_, ok, err := l.Adoptable(ctx, nonce)
	return ok, err
}

// AdoptEach runs adopt on each of items (a takeover's imported nonces or
// ids of one owner) and returns how many it adopted, with every error
// naming its item.
func AdoptEach(items []string, adopt func(item string) (bool, error)) (int, error) {
	n := 0
	var errs []error
	for _, it := range items {
		ok, err := adopt(it)
		if err != nil {
			errs = append(errs, fmt.Errorf("adopt %s: %w", it, err))
		}
		if ok {
			n++
		}
	}
	return n, errors.Join(errs...)
}
