package beam_test

import (
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/tools/go/packages"
)

// loadModule type-checks every package of the module with its tests, once
// for the tests of this file.
var loadModule = sync.OnceValues(func() ([]*packages.Package, error) {
	cfg := &packages.Config{
		Mode:  packages.NeedName | packages.NeedFiles | packages.NeedTypes | packages.NeedTypesInfo,
		Tests: true,
	}
	return packages.Load(cfg, "./...")
})

// publicAPI reads the package's doc.go: a public package says "It is a
// public API", any other "not a public API". It fails the test when the
// file is missing or says neither.
func publicAPI(t *testing.T, p *packages.Package) bool {
	t.Helper()
	if len(p.GoFiles) == 0 {
		return false
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(filepath.Dir(p.GoFiles[0]), "doc.go"), nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Errorf("%s has no doc.go with a package comment (%v)", p.PkgPath, err)
		return false
	}
	text := strings.Join(strings.Fields(f.Doc.Text()), " ")
	switch {
	case strings.Contains(text, "not a public API"):
		return false
	case strings.Contains(text, "is a public API"):
		return true
	}
	t.Errorf("%s: doc.go says neither \"It is a public API\" nor \"not a public API\"", p.PkgPath)
	return false
}

// TestNoUnusedExports keeps the surface of the packages that are not a
// public API as small as their use: an exported package-level name there
// must be used by another package (a package's own black-box tests count,
// as they use it the way a caller would). Each package's doc.go says
// whether it is a public API; only those keep names nobody here uses.
func TestNoUnusedExports(t *testing.T) {
	t.Parallel()
	pkgs, err := loadModule()
	require.NoError(t, err)
	type name struct{ pkg, name string }
	users := map[name]map[string]bool{}
	use := func(o types.Object, by string) {
		if o.Pkg() == nil || !o.Exported() || o.Parent() != o.Pkg().Scope() {
			return
		}
		n := name{o.Pkg().Path(), o.Name()}
		if users[n] == nil {
			users[n] = map[string]bool{}
		}
		users[n][by] = true
	}
	for _, p := range pkgs {
		require.Empty(t, p.Errors, "package %s does not load", p.ID)
		for _, o := range p.TypesInfo.Uses {
			use(o, p.PkgPath)
		}
		// A type is used where a value of it is, even unnamed: the result
		// of a call, a constant of the type.
		for _, tv := range p.TypesInfo.Types {
			if n, ok := elem(tv.Type).(*types.Named); ok {
				use(n.Obj(), p.PkgPath)
			}
		}
	}
	var unused []string
	checked := map[string]bool{}
	for _, p := range pkgs {
		if p.Name == "main" || strings.HasSuffix(p.PkgPath, "_test") || strings.HasSuffix(p.PkgPath, ".test") || checked[p.PkgPath] {
			continue
		}
		checked[p.PkgPath] = true
		if publicAPI(t, p) {
			continue
		}
		scope := p.Types.Scope()
		for _, n := range scope.Names() {
			if !scope.Lookup(n).Exported() {
				continue
			}
			used := false
			for u := range users[name{p.PkgPath, n}] {
				used = used || u != p.PkgPath
			}
			if !used {
				unused = append(unused, p.PkgPath+"."+n)
			}
		}
	}
	slices.Sort(unused)
	require.Empty(t, unused, "exported names no other package uses: unexport them (or say in the package's doc.go that it is a public API)")
}

// elem strips pointers and slices off t.
func elem(t types.Type) types.Type {
	for {
		switch u := t.(type) {
		case *types.Pointer:
			t = u.Elem()
		case *types.Slice:
			t = u.Elem()
		default:
			return t
		}
	}
}
