package beam

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryConfigFieldReachesTheAssembly type-checks the package and
// requires every field of Config, nested ones included, to be read by the
// assembly's code (its non-test files): a field nothing reads would be a
// setting an embedder makes and the directory ignores. Writes (filling in
// defaults) and the keys of composite literals (DefaultLimits) do not count.
func TestEveryConfigFieldReachesTheAssembly(t *testing.T) {
	pkg, info, files := typeCheck(t)

	read := map[*types.Var]bool{}
	for _, f := range files {
		written := map[ast.Expr]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, lhs := range n.Lhs {
					written[lhs] = true
				}
			case *ast.SelectorExpr:
				if sel, ok := info.Selections[n]; ok && sel.Kind() == types.FieldVal && !written[n] {
					read[sel.Obj().(*types.Var)] = true
				}
			}
			return true
		})
	}

	config := pkg.Scope().Lookup("Config").Type().(*types.Named)
	n := 0
	var walk func(path string, s *types.Struct)
	walk = func(path string, s *types.Struct) {
		for i := range s.NumFields() {
			field := s.Field(i)
			name := field.Name()
			if path != "" {
				name = path + "." + name
			}
			if nested, ok := configPart(pkg, field.Type()); ok {
				walk(name, nested)
				continue
			}
			n++
			t.Run(name, func(t *testing.T) {
				require.True(t, read[field], "Config.%s is read nowhere in the assembly", name)
			})
		}
	}
	walk("", config.Underlying().(*types.Struct))
	require.Greater(t, n, 40, "the walk sees Config's fields")
}

// configPart returns the struct of a nested part of Config (Federation,
// Cluster, Limits, ...): a struct type of this package, or a pointer to
// one. Rate is a value, read as a whole.
func configPart(pkg *types.Package, typ types.Type) (*types.Struct, bool) {
	if p, ok := typ.(*types.Pointer); ok {
		typ = p.Elem()
	}
	named, ok := typ.(*types.Named)
	if !ok || named.Obj().Pkg() != pkg || named.Obj().Name() == "Rate" {
		return nil, false
	}
	s, ok := named.Underlying().(*types.Struct)
	return s, ok
}

// typeCheck parses and type-checks this package's non-test files, importing
// its dependencies from the export data `go list -export` builds.
func typeCheck(t *testing.T) (*types.Package, *types.Info, []*ast.File) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	require.NoError(t, err)
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), " "); ok && file != "" {
			exports[path] = file
		}
	}
	require.NoError(t, sc.Err())

	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		files = append(files, f)
	}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})}
	pkg, err := conf.Check("github.com/beamdir/beam", fset, files, info)
	require.NoError(t, err)
	return pkg, info, files
}
