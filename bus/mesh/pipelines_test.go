package mesh

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParsePipelines(t *testing.T) {
	t.Parallel()
	ps, err := ParsePipelines([]byte(`{"pipelines":[
		{"name":"enrich","description":"adds facts","inputSchema":{"type":"object","properties":{"product_id":{"type":"string"}}},
		 "route":["prep@acme.beam.directory","infer@acme.beam.directory"]},
		{"name":"echo","route":["echo@beam.directory"]}]}`))
	require.NoError(t, err)
	require.Len(t, ps, 2)
	require.Equal(t, []string{"prep@acme.beam.directory", "infer@acme.beam.directory"}, ps[0].Route)
	require.JSONEq(t, `{"type":"object"}`, string(ps[1].InputSchema), "a pipeline without a schema takes any object")
	require.NoError(t, ps[0].CheckInput([]byte(`{"product_id":"123"}`)))
	require.ErrorContains(t, ps[0].CheckInput([]byte(`{"product_id":123}`)), "input schema of enrich")
	require.NoError(t, ps[1].CheckInput([]byte(`{"any":"thing"}`)))

	for name, tc := range map[string]struct{ file, want string }{
		"unknown field":       {`{"pipelines":[{"name":"a","route":["a@beam.directory"],"steps":1}]}`, `unknown field "steps"`},
		"bad name":            {`{"pipelines":[{"name":"a b","route":["a@beam.directory"]}]}`, `name "a b"`},
		"duplicate":           {`{"pipelines":[{"name":"a","route":["a@beam.directory"]},{"name":"a","route":["a@beam.directory"]}]}`, `declared twice`},
		"empty route":         {`{"pipelines":[{"name":"a","route":[]}]}`, `route is empty`},
		"reserved actor":      {`{"pipelines":[{"name":"a","route":["x-sink"]}]}`, `x-sink`},
		"not a beam id":       {`{"pipelines":[{"name":"a","route":["prep@example.com"]}]}`, `not a Beam ID`},
		"schema not object":   {`{"pipelines":[{"name":"a","route":["a@beam.directory"],"inputSchema":{"type":"string"}}]}`, `type must be "object"`},
		"schema not json obj": {`{"pipelines":[{"name":"a","route":["a@beam.directory"],"inputSchema":[1]}]}`, `JSON Schema object`},
		"not json":            {`{"pipelines":`, `pipelines file`},
	} {
		_, err := ParsePipelines([]byte(tc.file))
		require.ErrorContains(t, err, tc.want, name)
	}
}
