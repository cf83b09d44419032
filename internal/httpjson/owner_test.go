package httpjson

import (
	"go/ast"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/beamdir/beam/internal/srcscan"
	"github.com/stretchr/testify/require"
)

// The names the Beam error shape had before it had one owner: a package's
// own error type, and its own writer (a function taking an
// http.ResponseWriter).
var (
	privateErrorType   = regexp.MustCompile(`(?i)apierror|inputerror`)
	privateErrorWriter = regexp.MustCompile(`(?i)apierror|writeerror|writeerr$|writejson`)
)

// writesResponse reports whether fn takes an http.ResponseWriter.
func writesResponse(fn *ast.FuncDecl) bool {
	for _, p := range fn.Type.Params.List {
		if sel, ok := p.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "ResponseWriter" {
			return true
		}
	}
	return false
}

// TestBeamErrorShapeHasOneOwner fails when a non-test file outside this
// package defines its own error type or writer for the Beam error shape
// (a name like apiError, writeError or writeJSON), builds the shape by hand
// (a map literal with an "errorCode" key, or a JSON string literal
// {"error":…,"errorCode":…}): routes return an *Error to an Adapter, and
// everything else writes through Write, WriteError or Error.Marshal.
func TestBeamErrorShapeHasOneOwner(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	var found []string
	err = srcscan.Files(root, []string{"internal/httpjson"}, func(rel string, fset *token.FileSet, f *ast.File) {
		at := func(n ast.Node, what string) {
			found = append(found, rel+":"+strconv.Itoa(fset.Position(n.Pos()).Line)+": "+what)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if privateErrorWriter.MatchString(n.Name.Name) && writesResponse(n) {
					at(n, "func "+n.Name.Name)
				}
			case *ast.TypeSpec:
				if privateErrorType.MatchString(n.Name.Name) {
					at(n, "type "+n.Name.Name)
				}
			case *ast.CompositeLit:
				if _, ok := n.Type.(*ast.MapType); !ok {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.BasicLit); ok && k.Kind == token.STRING && k.Value == `"errorCode"` {
						at(n, "map literal with \"errorCode\"")
					}
				}
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(n.Value)
				if err == nil && strings.HasPrefix(s, `{"error":"`) && strings.Contains(s, `"errorCode":`) {
					at(n, "a Beam error body as a string")
				}
			}
			return true
		})
	})
	require.NoError(t, err)
	require.Empty(t, found, "the Beam error shape is built outside internal/httpjson: return an *httpjson.Error through an httpjson.Adapter instead")
}
