package test

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/imshard/imshard/"

// roleModules are the packages of one job each that app wires into roles
// (and the benchmark drivers, which only cmd uses): they may use the
// libraries and the shared packages under modules/ but never each other.
var roleModules = map[string]bool{"send": true, "changes": true, "persist": true, "query": true, "inbox": true,
	"stream": true, "shardmgr": true, "migrate": true, "relay": true, "bench": true,
	"retention": true, "archive": true, "move": true}

// libraries are the shared machinery of several modules, no role of their
// own: they may use the shared packages below them, never a module nor
// each other.
var libraries = map[string]bool{"readpath": true, "routecheck": true, "feed": true}

// TestImportDirection enforces main → cmd → app → modules/<module> →
// modules/<library> → modules/routing (+ small shared packages) → config,
// sql, lua.
func TestImportDirection(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(root, "modules"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join(root, "modules"), path)
		pkg := strings.Split(filepath.ToSlash(rel), "/")[0]
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if !strings.HasPrefix(p, module) {
				continue
			}
			target := strings.TrimPrefix(p, module)
			switch {
			case strings.HasPrefix(target, "test/testenv") && strings.HasSuffix(path, "_test.go"):
				// tests of a module may use the shared test services
			case strings.HasPrefix(target, "app") || strings.HasPrefix(target, "cmd") || strings.HasPrefix(target, "test"):
				t.Errorf("%s imports %s: modules never reach up into app, cmd or test", rel, target)
			case strings.HasPrefix(target, "modules/"):
				other := strings.Split(strings.TrimPrefix(target, "modules/"), "/")[0]
				if other == pkg {
					continue
				}
				if roleModules[other] {
					t.Errorf("%s imports module %s: modules talk through libraries, routing and small interfaces that app wires", rel, other)
				}
				if libraries[other] && !roleModules[pkg] {
					t.Errorf("%s imports library %s: only modules use the libraries", rel, other)
				}
				if pkg == "routing" {
					t.Errorf("%s imports %s: routing is the bottom of the module graph", rel, target)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sharedTables are the tenant tables more than one role reads or writes,
// each with the one file (or package) that holds its name and therefore all
// its SQL; every other package goes through its typed functions. The
// membership tables and the read cursors belong to acl, the one authority
// on memberships: whatever follows a membership is written only there.
var sharedTables = map[string]string{
	"im_group_message_topic_shards": "modules/routing/mirror.go",
	"im_group_message_shards":       "modules/routing/catalog.go",
	"im_group_message_activations":  "modules/routing/catalog.go",
	"im_seq_reservations":           "modules/routing/alloc.go",
	"im_group_message_route_repair": "modules/routing/repairqueue.go",
	"im_groups":                     "modules/acl",
	"im_group_members":              "modules/acl",
	"im_user_read_cursors":          "modules/acl",
	"im_topic_mentions":             "modules/routing/mentions.go",
	"im_migration":                  "modules/routing/migration.go",
	"im_dellog":                     "modules/readpath",
	"im_message_revisions":          "modules/readpath",
	"im_topic_changes":              "modules/readpath",
	"im_change_outbox":              "modules/feed",
	"im_legal_holds":                "modules/retention",
	"im_legal_hold_targets":         "modules/retention",
	"im_jobs":                       "modules/retention",
}

// aclOwned are the names only modules/acl may use: the constants naming its
// tables, the Redis keys of each user's cached read state and the groups
// epoch it is checked against (built in routing), and the scripts that
// write that entry (registered in routing/scripts.go). A package using one
// of them could read or write the entry, or the cursors, apart from the
// membership decision.
var aclOwned = map[string]bool{
	"GroupsTable": true, "MembersTable": true, "CursorsTable": true,
	"ReadCursors": true, "ReadCursorsVersion": true, "GroupsEpoch": true,
	"CursorPut": true, "CursorFill": true,
}

// TestSharedTablesHaveOneOwner fails when a shared table's name appears as
// a string in any non-test file of modules/, app/ or cmd/ other than its
// owner, or is reached there through an owner's exported constant holding
// it, when a name only acl may use (aclOwned) is used outside it, or when
// an owner's exported function takes an untyped column set
// (map[string]any): every change to a shared table is a typed function.
func TestSharedTablesHaveOneOwner(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(self))
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, dir := range []string{"modules", "app", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(file string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(file, ".go") || strings.HasSuffix(file, "_test.go") {
				return err
			}
			rel, _ := filepath.Rel(root, file)
			f, err := parser.ParseFile(fset, file, nil, 0)
			files[filepath.ToSlash(rel)] = f
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	names := tableConsts(files)
	for rel, f := range files {
		imports := importNames(f)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				for table, owner := range sharedTables {
					if strings.Contains(n.Value, table) && !ownedBy(rel, owner) {
						t.Errorf("%s: names %s, which only %s may touch", fset.Position(n.Pos()), table, owner)
					}
				}
			case *ast.FuncDecl:
				if n.Name.IsExported() && owns(rel) && takesColumnMap(n.Type) {
					t.Errorf("%s: %s takes a map[string]any: a shared table's owner takes typed changes", fset.Position(n.Pos()), n.Name.Name)
				}
			case *ast.SelectorExpr:
				if aclOwned[n.Sel.Name] && path.Dir(rel) != "modules/acl" && rel != "modules/routing/scripts.go" {
					t.Errorf("%s: uses %s, which only modules/acl may", fset.Position(n.Pos()), n.Sel.Name)
				}
				if x, ok := n.X.(*ast.Ident); ok {
					if table, ok := names[imports[x.Name]+"."+n.Sel.Name]; ok && !aclOwned[n.Sel.Name] {
						t.Errorf("%s: reaches %s through %s.%s, which only %s may touch", fset.Position(n.Pos()), table, x.Name, n.Sel.Name, sharedTables[table])
					}
				}
			}
			return true
		})
	}
}

// tableConsts are the exported constants that hold a shared table's name,
// each as "package directory.Name" with the table it names.
func tableConsts(files map[string]*ast.File) map[string]string {
	out := map[string]string{}
	for rel, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				for i, name := range v.Names {
					lit, ok := valueAt(v, i).(*ast.BasicLit)
					if !ok || !name.IsExported() {
						continue
					}
					for table := range sharedTables {
						if strings.Contains(lit.Value, table) {
							out[path.Dir(rel)+"."+name.Name] = table
						}
					}
				}
			}
		}
	}
	return out
}

// valueAt is the i-th value of a constant spec, nil when it has none.
func valueAt(v *ast.ValueSpec, i int) ast.Expr {
	if i < len(v.Values) {
		return v.Values[i]
	}
	return nil
}

// importNames maps the names a file refers to its module's packages by to
// their directories (modules/readpath).
func importNames(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		if !strings.HasPrefix(p, module) {
			continue
		}
		name := path.Base(p)
		if im.Name != nil {
			name = im.Name.Name
		}
		out[name] = strings.TrimPrefix(p, module)
	}
	return out
}

// ownedBy tells whether the file rel is owner or lies in the owning package.
func ownedBy(rel, owner string) bool {
	return rel == owner || path.Dir(rel) == owner
}

// owns tells whether the file rel owns a shared table (is the owner, or
// lies in the owning package).
func owns(rel string) bool {
	for _, owner := range sharedTables {
		if ownedBy(rel, owner) {
			return true
		}
	}
	return false
}

// takesColumnMap tells whether a function has a map[string]any parameter.
func takesColumnMap(ft *ast.FuncType) bool {
	for _, f := range ft.Params.List {
		m, ok := f.Type.(*ast.MapType)
		if !ok {
			continue
		}
		k, kok := m.Key.(*ast.Ident)
		v, vok := m.Value.(*ast.Ident)
		_, empty := m.Value.(*ast.InterfaceType)
		if kok && k.Name == "string" && (vok && v.Name == "any" || empty) {
			return true
		}
	}
	return false
}

// TestCrashHookOnlyInTestBuilds: the fault tests' crash hook is compiled
// only with the imshard_testhooks build tag, so a shipped binary cannot be
// made to kill itself by its environment.
func TestCrashHookOnlyInTestBuilds(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(filepath.Dir(self)), "modules", "persist")
	for _, tags := range [][]string{nil, {"imshard_testhooks"}} {
		ctx := build.Default
		ctx.BuildTags = tags
		pkg, err := ctx.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		hook, inert := slices.Contains(pkg.GoFiles, "crash_hook.go"), slices.Contains(pkg.GoFiles, "crash_nohook.go")
		if hook != (tags != nil) || inert == (tags != nil) {
			t.Fatalf("tags %v build %v", tags, pkg.GoFiles)
		}
	}
}
