package srcscan

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
)

// Files parses every non-test .go file under root and calls fn with its
// slash-separated path relative to root. Hidden directories, testdata,
// vendor, node_modules and fixtures are skipped, and so is every directory
// whose relative path skip names.
func Files(root string, skip []string, fn func(rel string, fset *token.FileSet, f *ast.File)) error {
	fset := token.NewFileSet()
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return fmt.Errorf("relative path of %s: %w", path, err)
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch name := d.Name(); {
			case rel == ".":
				return nil
			case strings.HasPrefix(name, "."), name == "testdata", name == "vendor", name == "node_modules", name == "fixtures":
				return filepath.SkipDir
			}
			for _, s := range skip {
				if rel == s {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse %s: %w", rel, err)
		}
		fn(rel, fset, f)
		return nil
	})
}
