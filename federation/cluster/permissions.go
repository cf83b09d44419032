package cluster

import (
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/beamdir/beam/federation"
)

// NodePermissions are the NATS permissions of the nodes of domain's
// cluster on an external deployment (--nats-url). The nodes share the
// directory key, so they are one nkey user: a directory's permissions
// (federation.SharedPermissions) plus JetStream (its API, flow control and
// acknowledgements, the KV buckets) and the cluster's subjects
// beam.cluster.<token>.>, and publishing into its own reply inbox: a
// node answers another node's call in chunks and streams an event stream
// chunk by chunk into the caller's inbox, more messages than the one
// response a request allows. Every other user of the account must be denied
// JetStream and the cluster subjects (federation's reservedSubjects), as the
// entries of beam peer nats-user are.
func NodePermissions(domain string) *server.Permissions {
	p := federation.SharedPermissions(domain)
	own := "beam.cluster." + Token(domain) + ".>"
	p.Publish.Allow = append(slices.Clone(p.Publish.Allow), own, federation.InboxPrefix(domain)+".>",
		"$JS.API.>", "$JS.FC.>", "$JS.ACK.>", "$KV.>")
	p.Publish.Deny = nil
	p.Subscribe.Allow = append(slices.Clone(p.Subscribe.Allow), own)
	p.Subscribe.Deny = nil
	return p
}
