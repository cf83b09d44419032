package beam

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// module is this module's path.
const module = "github.com/beamdir/beam"

// leafImports are the packages outside internal/ a leaf under internal/ may
// import: leaves themselves.
var leafImports = []string{module + "/agents/wire", module + "/attempt"}

// TestLayoutReadsOneWay keeps the floors of the module in order, imports
// running down only: the root (the assembly) on top, imported by cmd/beam
// alone; the domain packages (directory, bus, federation, tracing, web,
// agents) beneath it, never importing it; and the leaves under internal/,
// which import no package of the module outside internal/ but agents/wire
// and attempt. A package under internal/ that only tests import is a test
// bundle, which may start the domain packages. Test files are free.
func TestLayoutReadsOneWay(t *testing.T) {
	pkgs := moduleImports(t)
	require.Contains(t, pkgs, module+"/directory", "the walk sees the module's packages")

	// Who imports each internal package from a non-test file.
	usedByCode := map[string]bool{}
	for _, imports := range pkgs {
		for _, imp := range imports {
			usedByCode[imp] = true
		}
	}
	for pkg, imports := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		for _, imp := range imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			switch {
			case strings.HasPrefix(rel, "internal/"):
				if usedByCode[pkg] && !strings.HasPrefix(imp, module+"/internal/") && !slices.Contains(leafImports, imp) {
					t.Errorf("%s is a leaf (code imports it) but imports %s: leaves import only internal/, agents/wire and attempt", rel, imp)
				}
				if imp == module {
					t.Errorf("%s imports the root package", rel)
				}
			case rel == "" || rel == "cmd/beam" || strings.HasPrefix(rel, "cmd/beam/"):
			default:
				if imp == module {
					t.Errorf("%s imports the root package, which sits on top of it", rel)
				}
			}
		}
	}
}

// moduleImports maps each package of the module to the imports of its
// non-test files.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "fixtures" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := path.Join(module, filepath.ToSlash(filepath.Dir(p)))
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			pkgs[pkg] = append(pkgs[pkg], imp)
		}
		return nil
	})
	require.NoError(t, err)
	return pkgs
}
