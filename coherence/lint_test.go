package coherence

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPurity keeps the state machine pure: its non-test files import only
// the standard library (minus anything that does I/O, keeps time or runs
// concurrently) and internal/ids, start no goroutine and never read the
// clock.
func TestPurity(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	banned := map[string]bool{
		"net": true, "os": true, "os/exec": true, "syscall": true, "time": true,
		"sync": true, "sync/atomic": true, "unsafe": true, "io/ioutil": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "log": true, "log/slog": true,
	}
	checked := 0
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		checked++
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			switch {
			case path == "github.com/dsmkit/dsm/internal/ids":
			case strings.Contains(first, "."):
				t.Errorf("%s imports %q: coherence may import only the standard library and internal/ids", name, path)
			case banned[path] || strings.HasPrefix(path, "net/"):
				t.Errorf("%s imports %q: coherence does no I/O, keeps no time and runs no goroutines", name, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement at %v: coherence starts no goroutines", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && n.Sel.Name == "Now" {
					t.Errorf("%s: time.Now at %v: time is ticks", name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
