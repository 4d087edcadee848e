package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fenceExempt are the packages that write to a tenant database outside the
// placement fence by their nature: the mover (its own state, the copy and
// the switch), the placement records (on the placement servers), the pools
// (the database and its schema) and the benchmarks (their own databases).
// routing/placement.go holds Fenced itself.
var fenceExempt = map[string]bool{"move": true, "placement": true, "tenantdb": true, "bench": true, "testhook": true}

// TestTenantWritesFenced: every write to a tenant database runs inside
// routing.Fenced (or is a routing.FencedDDL statement). Nothing under
// modules/ but routing.Fenced begins a transaction, and every ExecContext
// runs on a *sql.Tx parameter of its function — a transaction only
// routing.Fenced hands out — so a writer that bypasses the fence fails
// here.
func TestTenantWritesFenced(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(filepath.Dir(file)), "modules")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if fenceExempt[strings.Split(rel, "/")[0]] || rel == "routing/placement.go" {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checkFencedWrites(t, fset, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkFencedWrites(t *testing.T, fset *token.FileSet, f *ast.File) {
	t.Helper()
	var scopes []map[string]bool // *sql.Tx parameters of the enclosing functions
	var walk func(n ast.Node) bool
	walk = func(n ast.Node) bool {
		var ft *ast.FuncType
		var body *ast.BlockStmt
		switch fn := n.(type) {
		case *ast.FuncDecl:
			ft, body = fn.Type, fn.Body
		case *ast.FuncLit:
			ft, body = fn.Type, fn.Body
		case *ast.CallExpr:
			sel, ok := fn.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch sel.Sel.Name {
			case "BeginTx", "Begin":
				t.Errorf("%s: a transaction begun outside routing.Fenced", fset.Position(fn.Pos()))
			case "ExecContext":
				runner := execRunner(sel.X)
				id, ok := runner.(*ast.Ident)
				if !ok || !txParam(scopes, id.Name) {
					t.Errorf("%s: ExecContext outside a routing.Fenced transaction (run it on the *sql.Tx Fenced hands out, or FencedDDL)", fset.Position(fn.Pos()))
				}
			}
			return true
		default:
			return true
		}
		if body == nil {
			return false
		}
		txs := map[string]bool{}
		for _, p := range ft.Params.List {
			if star, ok := p.Type.(*ast.StarExpr); ok {
				if s, ok := star.X.(*ast.SelectorExpr); ok && s.Sel.Name == "Tx" {
					for _, name := range p.Names {
						txs[name.Name] = true
					}
				}
			}
		}
		scopes = append(scopes, txs)
		ast.Inspect(body, walk)
		scopes = scopes[:len(scopes)-1]
		return false
	}
	ast.Inspect(f, walk)
}

// execRunner is what an ExecContext runs on: the argument of a squirrel
// RunWith, or the root of the receiver (tx.ExecContext,
// tx.StmtContext(...).ExecContext).
func execRunner(x ast.Expr) ast.Expr {
	for {
		switch e := x.(type) {
		case *ast.CallExpr:
			if sel, ok := e.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "RunWith" && len(e.Args) == 1 {
				return e.Args[0]
			}
			x = e.Fun
		case *ast.SelectorExpr:
			x = e.X
		default:
			return x
		}
	}
}

func txParam(scopes []map[string]bool, name string) bool {
	for i := len(scopes) - 1; i >= 0; i-- {
		if scopes[i][name] {
			return true
		}
	}
	return false
}
