package mesh

import "github.com/beamdir/beam/tracing"

// lifecycle is the status lifecycle of a pipeline envelope, as data. A
// status never moves back (pending, then running, retrying or unknown,
// then paused, then a terminal one); a terminal status is final; paused
// moves back to running only by a resume; a step may repeat a non-terminal
// status (it carries fresh progress). The fold (tracing.MeshRow.Apply)
// drops, and counts as stale, a step whose status change the table lacks:
// a hop's report may arrive after the envelope moved on. The engine checks
// the table before it appends a pause or a resume (annotate).
var lifecycle = tracing.Register(&tracing.Lifecycle{
	Name:    "pipeline envelope",
	Owner:   tracing.OwnerMesh,
	Package: "bus/mesh",
	Doc: "An Asya-style pipeline envelope. Its status is `details.mesh.status` of its steps, folded into " +
		"`beam_mesh`; by `step` is any step but a resume. A step out of the table is recorded and dropped " +
		"by the fold (counted in `stale`), since a hop's report may arrive after the envelope moved on.",
	Checked: "bus/mesh, before it appends a pause or a resume; the fold drops any other step out of the table",
	States:  tracing.Names(tracing.MeshStatuses),
	Terminal: []string{string(tracing.MeshSucceeded), string(tracing.MeshFailed),
		string(tracing.MeshCanceled)},
	Transitions: []tracing.Transition{
		{From: "", To: "pending", On: tracing.MeshKindCreated},

		{From: "pending", To: "pending", On: "step"},
		{From: "pending", To: "running", On: "step"},
		{From: "pending", To: "retrying", On: "step"},
		{From: "pending", To: "unknown", On: "step"},
		{From: "pending", To: "paused", On: "step"},
		{From: "pending", To: "succeeded", On: "step"},
		{From: "pending", To: "failed", On: "step"},
		{From: "pending", To: "canceled", On: "step"},

		{From: "running", To: "running", On: "step"},
		{From: "running", To: "retrying", On: "step"},
		{From: "running", To: "unknown", On: "step"},
		{From: "running", To: "paused", On: "step"},
		{From: "running", To: "succeeded", On: "step"},
		{From: "running", To: "failed", On: "step"},
		{From: "running", To: "canceled", On: "step"},

		{From: "retrying", To: "running", On: "step"},
		{From: "retrying", To: "retrying", On: "step"},
		{From: "retrying", To: "unknown", On: "step"},
		{From: "retrying", To: "paused", On: "step"},
		{From: "retrying", To: "succeeded", On: "step"},
		{From: "retrying", To: "failed", On: "step"},
		{From: "retrying", To: "canceled", On: "step"},

		{From: "unknown", To: "running", On: "step"},
		{From: "unknown", To: "retrying", On: "step"},
		{From: "unknown", To: "unknown", On: "step"},
		{From: "unknown", To: "paused", On: "step"},
		{From: "unknown", To: "succeeded", On: "step"},
		{From: "unknown", To: "failed", On: "step"},
		{From: "unknown", To: "canceled", On: "step"},

		{From: "paused", To: "paused", On: "step"},
		{From: "paused", To: "running", On: tracing.MeshKindResume},
		{From: "paused", To: "succeeded", On: "step"},
		{From: "paused", To: "failed", On: "step"},
		{From: "paused", To: "canceled", On: "step"},
	},
})

// stepOn is the operation of a step of kind in Lifecycle.
func stepOn(kind string) string {
	if kind == tracing.MeshKindResume {
		return tracing.MeshKindResume
	}
	return "step"
}
