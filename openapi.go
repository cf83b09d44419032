package beam

import (
	_ "embed"
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
)

// openAPI is the OpenAPI 3.1 description of the routes the main listener
// serves (openapi.json, written by hand; TestOpenAPIMatchesTheRoutes keeps
// it in step with the mux).
//
//go:embed openapi.json
var openAPI []byte

// handleOpenAPI serves GET /openapi.json.
func handleOpenAPI(w http.ResponseWriter, _ *http.Request) {
	httpjson.WriteRaw(w, http.StatusOK, "application/json", openAPI)
}
