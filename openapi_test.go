package beam

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// undocumentedRoutes are the patterns the main listener serves that
// openapi.json leaves out on purpose: the dashboard, the operator's
// profiles, the index at / and the trailing-slash twins of documented
// routes.
var undocumentedRoutes = map[string]string{
	"GET /{$}":                         "the index: links for humans, or a redirect to the dashboard",
	"GET /ws/":                         "any path below /ws is the WebSocket endpoint too",
	"GET /api/v1/mesh/{$}":             "the trailing-slash twin of GET /api/v1/mesh",
	"POST /api/v1/mesh/{$}":            "the trailing-slash twin of POST /api/v1/mesh",
	"GET /dashboard":                   "the dashboard",
	"GET /dashboard/login":             "the dashboard",
	"POST /dashboard/login":            "the dashboard",
	"POST /dashboard/logout":           "the dashboard",
	"GET /dashboard/{$}":               "the dashboard",
	"GET /dashboard/session":           "the dashboard",
	"/dashboard/":                      "the dashboard",
	"GET /dashboard/assets/{file...}":  "the dashboard",
	"GET /.well-known/agent-card.json": "the directory's A2A agent card: described by the A2A specification (docs/guides/a2a-mcp.md)",
	"POST /a2a":                        "the directory's A2A endpoint: described by the A2A specification (docs/guides/a2a-mcp.md)",
}

// undocumentedPrefixes are path prefixes left out of openapi.json: the
// profiles, and the A2A and MCP endpoints, described by the A2A and MCP
// specifications (docs/guides/a2a-mcp.md).
var undocumentedPrefixes = []string{"/debug/pprof/", "/a2a/", "/mcp"}

// unresolvedPatterns are Handle/HandleFunc calls whose pattern is not a
// constant expression, by file and expression, with where their routes
// are accounted for.
var unresolvedPatterns = map[string]string{
	"web/dashboard.go: pattern": "the dashboard's /observability routes (web.Dashboard.Routes' obs helper), left out like the dashboard",
}

// TestOpenAPIMatchesTheRoutes checks openapi.json against the mux of a real
// server, both ways: every documented operation is routed to the pattern
// with its method and path, and every pattern registered in the module's
// code is documented or listed above as left out on purpose.
func TestOpenAPIMatchesTheRoutes(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{Domain: "openapi.beam.directory", Federation: Federation{NATSListen: "127.0.0.1:0"}})

	status, ctype, body := l.get("/openapi.json", "", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "application/json", ctype)
	require.JSONEq(t, string(openAPI), body, "GET /openapi.json serves the embedded document")

	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(openAPI, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	requireRefsResolve(t, openAPI)

	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method, raw := range item {
			m := strings.ToUpper(method)
			if !isHTTPMethod(m) {
				continue
			}
			var op struct {
				Summary   string                     `json:"summary"`
				Responses map[string]json.RawMessage `json:"responses"`
				Security  *[]map[string][]string     `json:"security"`
				Route     string                     `json:"x-beam-route"`
			}
			require.NoError(t, json.Unmarshal(raw, &op), "%s %s", m, path)
			require.NotEmpty(t, op.Summary, "%s %s has a summary", m, path)
			require.NotEmpty(t, op.Responses, "%s %s has responses", m, path)
			require.NotNil(t, op.Security, "%s %s says who may call it", m, path)
			want := m + " " + path
			if op.Route != "" {
				want = op.Route // two documented paths served by one pattern
			}
			req := httptest.NewRequest(m, samplePath(path), nil)
			_, pattern := l.srv.mux.Handler(req)
			require.Equal(t, want, pattern, "the server routes %s %s", m, path)
			documented[want] = true
		}
	}

	for _, r := range registeredRoutes(t) {
		if _, skip := undocumentedRoutes[r.pattern]; skip || hasUndocumentedPrefix(r.pattern) {
			continue
		}
		require.True(t, documented[r.pattern],
			"%s registers %q, which openapi.json does not describe: document it (or list it in undocumentedRoutes with the reason)",
			r.where, r.pattern)
	}
}

// samplePath fills a path template's parameters with a value.
func samplePath(path string) string {
	return regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(path, "x")
}

func isHTTPMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

func hasUndocumentedPrefix(pattern string) bool {
	_, path, ok := strings.Cut(pattern, " ")
	if !ok {
		path = pattern
	}
	for _, p := range undocumentedPrefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// requireRefsResolve checks that every local $ref names a component.
func requireRefsResolve(t *testing.T, raw []byte) {
	t.Helper()
	var root map[string]any
	require.NoError(t, json.Unmarshal(raw, &root))
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				var node any = root
				for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
					m, ok := node.(map[string]any)
					require.True(t, ok, "$ref %s resolves", ref)
					node, ok = m[part]
					require.True(t, ok, "$ref %s resolves", ref)
				}
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(root)
}

// route is a pattern registered in the module's code.
type route struct {
	pattern string
	where   string // file:line
}

// routePattern is what a ServeMux pattern looks like: an optional method,
// then a path.
var routePattern = regexp.MustCompile(`^([A-Z]+ )?/`)

// registeredRoutes parses every non-test Go file of the module and returns
// the patterns of its Handle and HandleFunc calls. Patterns are string
// literals, constants, or concatenations of them; a call whose first
// argument is none of these must be listed in unresolvedPatterns. Calls
// whose argument is not a pattern (the Go SDK's Client.Handle takes an
// intent type) are skipped.
func registeredRoutes(t *testing.T) []route {
	t.Helper()
	root, err := filepath.Abs(".")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the test runs at the module root")

	fset := token.NewFileSet()
	type parsed struct {
		rel  string
		file *ast.File
	}
	var files []parsed
	consts := map[string]map[string]string{} // package name → constant → value
	var pending []pendingConst
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "fixtures") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files = append(files, parsed{rel: filepath.ToSlash(rel), file: f})
		pending = collectConsts(f, pending)
		return nil
	})
	require.NoError(t, err)
	resolveConsts(pending, consts)

	var out []route
	for _, p := range files {
		ast.Inspect(p.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			where := p.rel + ":" + strconv.Itoa(fset.Position(call.Pos()).Line)
			value, ok := constString(call.Args[0], p.file.Name.Name, consts)
			if !ok {
				key := p.rel + ": " + exprString(call.Args[0])
				_, listed := unresolvedPatterns[key]
				require.True(t, listed, "%s: the pattern %s is not a constant; list %q in unresolvedPatterns with where its routes are documented",
					where, exprString(call.Args[0]), key)
				return true
			}
			if routePattern.MatchString(value) {
				out = append(out, route{pattern: value, where: where})
			}
			return true
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pattern < out[j].pattern })
	require.NotEmpty(t, out)
	return out
}

// collectConsts adds the constants declared at the top of f to pending.
func collectConsts(f *ast.File, pending []pendingConst) []pendingConst {
	pkg := f.Name.Name
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				pending = append(pending, pendingConst{pkg, name.Name, vs.Values[i]})
			}
		}
	}
	return pending
}

// pendingConst is a constant declaration whose value may name another
// constant (of its package or an imported one), resolved once every file
// is read (resolveConsts).
type pendingConst struct {
	pkg, name string
	value     ast.Expr
}

// resolveConsts evaluates the collected constants until no more resolve,
// so a constant defined as another package's constant has its string.
func resolveConsts(pending []pendingConst, consts map[string]map[string]string) {
	for progress := true; progress; {
		progress = false
		for _, c := range pending {
			if _, done := consts[c.pkg][c.name]; done {
				continue
			}
			if s, ok := constString(c.value, c.pkg, consts); ok {
				if consts[c.pkg] == nil {
					consts[c.pkg] = map[string]string{}
				}
				consts[c.pkg][c.name] = s
				progress = true
			}
		}
	}
}

// constString evaluates a string literal, a constant of the package pkg
// or of an imported package (by its name), or a + of them.
func constString(e ast.Expr, pkg string, consts map[string]map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[pkg][e.Name]
		return s, ok
	case *ast.SelectorExpr:
		x, ok := e.X.(*ast.Ident)
		if !ok {
			return "", false
		}
		s, ok := consts[x.Name][e.Sel.Name]
		return s, ok
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok := constString(e.X, pkg, consts)
		if !ok {
			return "", false
		}
		b, ok := constString(e.Y, pkg, consts)
		return a + b, ok
	case *ast.ParenExpr:
		return constString(e.X, pkg, consts)
	}
	return "", false
}

// exprString renders a simple expression for messages.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.BasicLit:
		return e.Value
	case *ast.BinaryExpr:
		return exprString(e.X) + " " + e.Op.String() + " " + exprString(e.Y)
	}
	return "?"
}
