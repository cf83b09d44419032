package directory

import (
	"encoding/json"

	"github.com/beamdir/beam/agents/wire"
)

// OriginMesh is the transport of the received event of a pipeline hop that
// the directory relays to a peer directory's agent (PathPeer).
const OriginMesh = "mesh"

// pipelineHopIntent is the intent type of a pipeline hop's frame (the
// mesh.envelope intent of bus/mesh).
const pipelineHopIntent = wire.MeshIntent

// PeerFor returns the pinned peer directory that serves beamID when it is
// not an agent of this directory (false without federation, or when no
// pinned peer serves its domain).
func (d *Directory) PeerFor(beamID string) (string, bool) {
	r := d.remoteRouter()
	if r == nil {
		return "", false
	}
	if _, local := d.reg.Get(beamID); local && d.reg.Serves(beamID) {
		return "", false
	}
	return r.PeerFor(beamID)
}

// checkPipelineRouteAuthor applies a local recipient's policy to the agent
// that chose a pipeline hop relayed to it, as checkPolicy applies it to the
// frame's sender. A hop's frame is from the author of its content (the
// previous actor); the agent that chose the hop is the envelope's route
// author, its "author" or else its "creator". The directory that routes the
// envelope checks that author itself before a hop to one of its own agents
// (CheckPipelineHop); a hop relayed from a peer directory is checked here,
// since only the recipient's directory knows its policy. A frame whose
// payload is no envelope, or whose route author is its sender, has nothing
// more to check.
func (d *Directory) checkPipelineRouteAuthor(f *wire.IntentFrame) (code, msg string) {
	if f.Intent != pipelineHopIntent {
		return "", ""
	}
	var env struct {
		Creator string `json:"creator"`
		Author  string `json:"author"`
	}
	if json.Unmarshal(f.Payload, &env) != nil {
		return "", ""
	}
	author := env.Author
	if author == "" {
		author = env.Creator
	}
	if author == "" || author == f.From {
		return "", ""
	}
	if code, msg := d.checkPolicy(author, f.To, f.Intent); code != "" {
		return code, msg + ": the pipeline hop was chosen by " + author
	}
	return "", ""
}
