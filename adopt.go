package beam

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/beamdir/beam/tracing"
)

// adopt hands the items a takeover imported into this node's log from a
// dead node's log to the running subsystems, by owner (the nonces the
// import returns): the directory first, which settles the intents the dead
// node was relaying and notes the bus's nonces still in received, as at
// startup; then the bus, the pipelines and the job bus, in the order New
// recovers them. Each skips what it adopted already, so a taker that
// redoes a takeover may call it again. It returns how many items each
// owner adopted.
func (s *Server) adopt(ctx context.Context, byOwner map[tracing.Owner][]string) (map[tracing.Owner]int, error) {
	n := map[tracing.Owner]int{}
	var errs []error
	count := func(owner tracing.Owner, k int, err error) {
		n[owner] += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	k, err := s.dir.Adopt(ctx, slices.Concat(byOwner[tracing.OwnerDirectory], byOwner[tracing.OwnerBus]))
	count(tracing.OwnerDirectory, k, err)
	rep, err := s.bus.Adopt(ctx, byOwner[tracing.OwnerBus])
	count(tracing.OwnerBus, rep.Adopted, err)
	if s.mesh != nil {
		k, err := s.mesh.Adopt(ctx, byOwner[tracing.OwnerMesh])
		count(tracing.OwnerMesh, k, err)
	}
	if s.intent != nil {
		k, err := s.intent.svc.Adopt(ctx, byOwner[tracing.OwnerJobs])
		count(tracing.OwnerJobs, k, err)
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("adopt: %w", err)
	}
	return n, nil
}
