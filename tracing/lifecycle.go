package tracing

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Transition is one row of a lifecycle's transition table: a key in state
// From may move to state To by operation On. From "" stands for a key with
// no state yet; On "" for any operation.
type Transition struct {
	From, To, On string
}

// Lifecycle is the transition table of one system that keeps its state in
// the log (intents, bus messages, jobs, pipeline envelopes, outbox rows), as
// data. The system declares it in its own package and registers it with
// Register before it first appends; the log's writer then refuses, on
// append, an event of one of the system's nonces whose transition the table
// lacks (see Step), and docs/lifecycles.md is generated from the registered
// tables (Markdown).
type Lifecycle struct {
	// Name names what moves through the lifecycle ("intent", "job", ...).
	Name string
	// Owner is the details.owner of the nonces that follow the lifecycle;
	// "" for a lifecycle whose keys are not nonces (the outbox's rows).
	Owner Owner
	// Package is the Go package that declares the table.
	Package string
	// Doc says in a sentence or two what the lifecycle is.
	Doc string
	// Checked says who refuses a transition out of the table, when Step
	// is nil (the writer does when it is set).
	Checked string
	// States lists the states in lifecycle order.
	States []string
	// Terminal lists the states that end the lifecycle (a retry or an
	// operator's replay may still leave some of them, as the table says).
	Terminal []string
	// Repeat lists the states that may follow themselves: an event that
	// records something (an annotation) without moving the key.
	Repeat []string
	// Transitions is the table.
	Transitions []Transition
	// Step, when set, maps an event of a nonce of Owner to the transition
	// of this lifecycle it makes; cur is the nonce's canonical state before
	// the event ("" for a new nonce). ok false: the event makes none (it
	// continues an operation already checked, or does not concern this
	// lifecycle). The writer calls it on every append of such a nonce and
	// refuses the append when Allows says no. It must be a pure, cheap
	// function of its arguments.
	Step func(cur State, ev *Event) (from, to, on string, ok bool)
	// Projection, when set, is the table the log folds the events of
	// Owner's nonces into for the owner (owned.go).
	Projection *Projection

	allowed map[Transition]bool // the table, and every row also with On ""
	anyOn   map[[2]string]bool  // the rows whose On is ""
	repeat  map[string]bool
}

// Allows reports whether the table lets a key move from one state to
// another by operation on ("" asks whether any operation may).
func (lc *Lifecycle) Allows(from, to, on string) bool {
	if lc.allowed[Transition{from, to, on}] || lc.anyOn[[2]string{from, to}] {
		return true
	}
	return from != "" && from == to && lc.repeat[from]
}

// Names returns the states of a typed state list as the strings a
// Lifecycle holds.
func Names[S ~string](ss []S) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// Initial returns the states a new key may start in.
func (lc *Lifecycle) Initial() []string {
	var out []string
	for _, t := range lc.Transitions {
		if t.From == "" && !slices.Contains(out, t.To) {
			out = append(out, t.To)
		}
	}
	return out
}

// IsTerminal reports whether s is one of the lifecycle's terminal states.
func (lc *Lifecycle) IsTerminal(s string) bool { return slices.Contains(lc.Terminal, s) }

// check reports what is wrong with the table, or nil.
func (lc *Lifecycle) check() error {
	if lc.Name == "" || lc.Package == "" || len(lc.States) == 0 {
		return fmt.Errorf("lifecycle %q: name, package and states are required", lc.Name)
	}
	known := func(s string) bool { return slices.Contains(lc.States, s) }
	for _, s := range slices.Concat(lc.Terminal, lc.Repeat) {
		if !known(s) {
			return fmt.Errorf("lifecycle %q: unknown state %q", lc.Name, s)
		}
	}
	if len(lc.Initial()) == 0 {
		return fmt.Errorf("lifecycle %q: no transition from the empty state", lc.Name)
	}
	for _, t := range lc.Transitions {
		if (t.From != "" && !known(t.From)) || !known(t.To) {
			return fmt.Errorf("lifecycle %q: transition %s -> %s names an unknown state", lc.Name, t.From, t.To)
		}
	}
	return nil
}

func (lc *Lifecycle) compile() {
	lc.allowed = make(map[Transition]bool, 2*len(lc.Transitions))
	lc.anyOn = make(map[[2]string]bool)
	lc.repeat = make(map[string]bool, len(lc.Repeat))
	for _, t := range lc.Transitions {
		lc.allowed[t] = true
		lc.allowed[Transition{t.From, t.To, ""}] = true
		if t.On == "" {
			lc.anyOn[[2]string{t.From, t.To}] = true
		}
	}
	for _, s := range lc.Repeat {
		lc.repeat[s] = true
	}
}

// registry holds the registered lifecycles. It is written by Register
// (normally from package initialization) and read on every append, so a
// read is one atomic load.
var registry struct {
	mu  sync.Mutex
	cur atomic.Pointer[lifecycles]
}

type lifecycles struct {
	byName  map[string]*Lifecycle
	byOwner map[Owner]*Lifecycle
}

// Register compiles lc and adds it to the lifecycles the log knows, and
// returns it. A system registers its lifecycle once, from its package's
// initialization or before it first appends. Register panics on a malformed
// table or a second lifecycle of the same name or owner: both are
// programming errors.
func Register(lc *Lifecycle) *Lifecycle {
	if err := lc.check(); err != nil {
		panic(err)
	}
	if p := lc.Projection; p != nil {
		if err := p.check(); err != nil || lc.Owner == "" {
			panic(fmt.Sprintf("lifecycle %q: projection: %v (and an owner is required)", lc.Name, err))
		}
	}
	lc.compile()
	registry.mu.Lock()
	defer registry.mu.Unlock()
	old := registry.cur.Load()
	next := &lifecycles{byName: map[string]*Lifecycle{}, byOwner: map[Owner]*Lifecycle{}}
	if old != nil {
		for k, v := range old.byName {
			next.byName[k] = v
		}
		for k, v := range old.byOwner {
			next.byOwner[k] = v
		}
	}
	if next.byName[lc.Name] != nil || (lc.Owner != "" && next.byOwner[lc.Owner] != nil) {
		panic(fmt.Sprintf("lifecycle %q (owner %q) registered twice", lc.Name, lc.Owner))
	}
	next.byName[lc.Name] = lc
	if lc.Owner != "" {
		next.byOwner[lc.Owner] = lc
	}
	registry.cur.Store(next)
	return lc
}

// Lifecycles returns the registered lifecycles, by name.
func Lifecycles() []*Lifecycle {
	cur := registry.cur.Load()
	if cur == nil {
		return nil
	}
	out := make([]*Lifecycle, 0, len(cur.byName))
	for _, lc := range cur.byName {
		out = append(out, lc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LifecycleOf returns the lifecycle registered for the nonces of owner, or
// nil.
func LifecycleOf(owner Owner) *Lifecycle {
	if cur := registry.cur.Load(); cur != nil {
		return cur.byOwner[owner]
	}
	return nil
}

// ownerStep returns the transition ev makes in the lifecycle of owner, when
// that lifecycle checks events (Step) and ev makes one.
func ownerStep(owner Owner, cur State, ev *Event) (lc *Lifecycle, t Transition, ok bool) {
	if owner == "" {
		owner = OwnerDirectory
	}
	lc = LifecycleOf(owner)
	if lc == nil || lc.Step == nil {
		return nil, t, false
	}
	t.From, t.To, t.On, ok = lc.Step(cur, ev)
	return lc, t, ok
}

// LifecycleError is returned for an event of a registered lifecycle's
// nonce whose transition its table lacks. Nothing of the rejected append
// is written.
type LifecycleError struct {
	Lifecycle string
	Nonce     string
	From, To  string
	On        string
}

func (e *LifecycleError) Error() string {
	from := e.From
	if from == "" {
		from = "(new)"
	}
	on := ""
	if e.On != "" {
		on = " by " + e.On
	}
	return fmt.Sprintf("illegal %s transition for nonce %q: %s -> %s%s", e.Lifecycle, e.Nonce, from, e.To, on)
}

// Markdown renders lcs as the document docs/lifecycles.md: per lifecycle,
// its states and its transition table.
func Markdown(lcs []*Lifecycle) string {
	var b strings.Builder
	b.WriteString("<!-- Generated from the registered lifecycle tables: do not edit. Regenerate with\n" +
		"     go test . -run TestLifecyclesDoc -update-lifecycles   (from the module root)\n" +
		"     TestLifecyclesDoc fails when this file and the tables differ. -->\n\n")
	b.WriteString("# Lifecycles\n\n")
	b.WriteString("Every system that keeps state in the event log declares its lifecycle as a transition table in its\n" +
		"own package and registers it with the log (`tracing.Register`). The log's writer refuses, on append,\n" +
		"an event whose transition the table of its nonce's owner lacks. `(new)` is a key without a state yet;\n" +
		"an empty *by* column means any operation.\n")
	for _, lc := range lcs {
		fmt.Fprintf(&b, "\n## %s\n\n", lc.Name)
		fmt.Fprintf(&b, "%s\n\n", lc.Doc)
		owner := "—"
		if lc.Owner != "" {
			owner = "`" + string(lc.Owner) + "`"
		}
		fmt.Fprintf(&b, "- declared in: `%s`\n", lc.Package)
		fmt.Fprintf(&b, "- owner (details.owner): %s\n", owner)
		checked := lc.Checked
		if lc.Step != nil {
			checked = "the log's writer, on every append of one of its nonces"
		}
		fmt.Fprintf(&b, "- checked by: %s\n", checked)
		if lc.Projection != nil {
			fmt.Fprintf(&b, "- projection kept by the log: `%s`\n", lc.Projection.Table)
		}
		fmt.Fprintf(&b, "- states: %s\n", codes(lc.States))
		fmt.Fprintf(&b, "- initial: %s\n", codes(lc.Initial()))
		fmt.Fprintf(&b, "- terminal: %s\n", codes(lc.Terminal))
		if len(lc.Repeat) > 0 {
			fmt.Fprintf(&b, "- may follow themselves (annotations): %s\n", codes(lc.Repeat))
		}
		b.WriteString("\n| from | to | by |\n|---|---|---|\n")
		for _, t := range lc.Transitions {
			from := t.From
			if from == "" {
				from = "(new)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", from, t.To, t.On)
		}
	}
	return b.String()
}

func codes(ss []string) string {
	if len(ss) == 0 {
		return "—"
	}
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "`" + s + "`"
	}
	return strings.Join(q, ", ")
}
