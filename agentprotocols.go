package beam

import (
	"fmt"

	"github.com/beamdir/beam/bus/a2a"
	"github.com/beamdir/beam/bus/mcp"
	"github.com/beamdir/beam/bus/mesh"
	"github.com/beamdir/beam/directory/registry"
)

// mountAgentProtocols serves the declared pipelines to A2A clients and MCP
// hosts. A task or tool call counts against the calling agent's intent
// rate limit (--limit-intents), as an intent it sends does.
func (s *Server) mountAgentProtocols(pipes *mesh.Engine, agents *registry.Registry, intents a2a.Intents) error {
	srv, err := a2a.New(a2a.Config{
		Mesh: pipes, Registry: agents, Pipelines: s.parsed.pipelines, Intents: intents, AllowCreator: s.rl.intents.Allow, Name: s.cfg.Domain, Logger: s.logger,
		Log: s.log, AllowPrivateWebhooks: s.cfg.AllowPrivateEndpoints,
	})
	if err != nil {
		return fmt.Errorf("open A2A server: %w", err)
	}
	s.a2a = srv
	srv.Routes(s.mux)
	tools, err := mcp.New(mcp.Config{Mesh: pipes, Pipelines: s.parsed.pipelines, AllowCreator: s.rl.intents.Allow, Logger: s.logger,
		Registry: agents, Intents: intents, Catalog: s.parsed.catalog})
	if err != nil {
		return fmt.Errorf("open MCP server: %w", err)
	}
	tools.Routes(s.mux)
	return nil
}
