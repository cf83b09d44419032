package beam

import (
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/bus"
	"github.com/beamdir/beam/bus/mesh"
)

// nonceOwners is the directory's directory.SessionOwner: the owners of the
// nonces the directory does not own, the message bus and the pipeline
// gateway. Both deliver through the directory, so they are built after it;
// openDirectory fills them in as it builds them, before anything is
// served (no session attaches and no cluster node reports one earlier).
type nonceOwners struct {
	bus  *bus.Bus
	mesh *mesh.Engine
}

// Connected wakes the messages and hops waiting for beamID.
func (o *nonceOwners) Connected(beamID string) {
	if o.bus != nil {
		o.bus.AgentConnected(beamID)
	}
	if o.mesh != nil {
		o.mesh.ActorConnected(beamID)
	}
}

// LateResult hands a result no delivery waits for to the bus.
func (o *nonceOwners) LateResult(beamID string, rf *wire.ResultFrame) bool {
	return o.bus != nil && o.bus.LateResult(beamID, rf)
}
