package bus

import "github.com/beamdir/beam/tracing"

// The lifecycle of a bus message, registered with the log as data: the canonical
// states its nonce takes. A message is queued (or dispatched at once to a
// connected recipient), dispatched by a WebSocket push, a poll lease, the
// cluster or federation, delivered, then acked, failed or dead-lettered; a
// retry, an expired lease or an operator's requeue queues it again. A
// state may repeat (an annotation: a federation outbox step, a second
// delivery report) except acked. The log's writer checks every event of a
// bus nonce against it.
var _ = tracing.Register(&tracing.Lifecycle{
	Name:    "bus message",
	Owner:   tracing.OwnerBus,
	Package: "bus",
	Doc: "A message accepted by the durable bus (`beam_messages`). Its states are the canonical states of its " +
		"nonce; the bus never records `validated`.",
	States:   []string{"received", "queued", "dispatched", "delivered", "acked", "failed", "dead_letter"},
	Terminal: []string{"acked", "failed", "dead_letter"},
	Repeat:   []string{"received", "queued", "dispatched", "delivered", "failed", "dead_letter"},
	Transitions: []tracing.Transition{
		{From: "", To: "received", On: "send"},
		{From: "received", To: "queued"},
		{From: "received", To: "dispatched"},
		{From: "received", To: "failed"},
		{From: "received", To: "dead_letter"},
		{From: "queued", To: "dispatched"},
		{From: "queued", To: "failed"},
		{From: "queued", To: "dead_letter"},
		{From: "dispatched", To: "delivered"},
		{From: "dispatched", To: "queued"},
		{From: "dispatched", To: "failed"},
		{From: "dispatched", To: "dead_letter"},
		{From: "delivered", To: "acked"},
		{From: "delivered", To: "queued"},
		{From: "delivered", To: "failed"},
		{From: "delivered", To: "dead_letter"},
		{From: "failed", To: "queued"},
		{From: "dead_letter", To: "queued"},
	},
	Step: messageStep,
})

// messageStep maps an event of a bus nonce to its transition: the
// canonical states themselves.
func messageStep(cur tracing.State, ev *tracing.Event) (from, to, on string, ok bool) {
	if cur == "" {
		return "", string(ev.State), "send", true
	}
	return string(cur), string(ev.State), "", true
}
