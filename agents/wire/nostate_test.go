package wire

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// deniedImport reports why a non-test file of this package may not import path, or "" when it may.
// Signatures are checked with crypto/ed25519 alone: no curve arithmetic of our own or reached under the
// standard library. A package that keeps no state has no use for locks or atomics.
func deniedImport(path string) string {
	switch {
	case strings.Contains(path, "edwards25519"), strings.Contains(path, "curve25519"),
		strings.HasPrefix(path, "crypto/internal/"), strings.HasPrefix(path, "golang.org/x/crypto/"),
		strings.HasPrefix(path, "filippo.io/"):
		return "curve arithmetic: verify with crypto/ed25519"
	case path == "sync", path == "sync/atomic", path == "unsafe":
		return "the package keeps no state"
	}
	return ""
}

// readOnlyTables are the package-level variables that are not errors: fixed byte strings never written.
var readOnlyTables = map[string]bool{"multicodecEd25519": true, "spkiPrefix": true, "pkcs8Prefix": true}

// TestNoCurveArithmeticAndNoState parses the package's own non-test files and fails when one imports
// curve arithmetic or synchronization, or declares a package-level variable that is neither an error nor
// one of the fixed byte tables: caches, pools and maps would be process-global state.
func TestNoCurveArithmeticAndNoState(t *testing.T) {
	t.Parallel()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := goparser.ParseFile(fset, name, src, goparser.SkipObjectResolution)
		require.NoError(t, err)
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			require.Empty(t, deniedImport(path), "%s imports %s", name, path)
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					isErr := strings.HasPrefix(id.Name, "Err") || strings.HasPrefix(id.Name, "err")
					require.True(t, isErr || readOnlyTables[id.Name] || id.Name == "_",
						"%s: package-level variable %s is state", name, id.Name)
				}
			}
		}
	}
	require.Positive(t, checked)
}

func TestDeniedImport(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"filippo.io/edwards25519", "filippo.io/edwards25519/field", "crypto/internal/fips140/edwards25519",
		"golang.org/x/crypto/ed25519", "golang.org/x/crypto/curve25519", "sync", "sync/atomic", "unsafe"} {
		require.NotEmpty(t, deniedImport(p), p)
	}
	for _, p := range []string{"crypto/ed25519", "crypto/sha512", "encoding/base64", "github.com/beamdir/beam/internal/jsonscan"} {
		require.Empty(t, deniedImport(p), p)
	}
}
