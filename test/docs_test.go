package test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
)

// TestRepositoryStandsAlone: no file of the repository sends its reader to
// a document outside it — the design notes, style rules or source
// documents a change was made from, or their section numbers. What they
// say belongs in docs/ in our own words.
func TestRepositoryStandsAlone(t *testing.T) {
	cites := regexp.MustCompile(`DESIGN|STYLE rule|\.\./shared|\bseed 0\d\d|\bseed §|[Ss]eed's`)
	// a section sign is someone's section number; only a public standard's is fine
	standard := regexp.MustCompile(`RFC \d+ $`)
	root := repoFile(".")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !regexp.MustCompile(`\.(go|md|sql|lua|ya?ml|sh|json|service)$|^Makefile$`).MatchString(d.Name()) ||
			strings.HasSuffix(path, "docs_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			cited := cites.MatchString(line)
			for rest := line; !cited && strings.Contains(rest, "§"); {
				before, after, _ := strings.Cut(rest, "§")
				cited, rest = !standard.MatchString(before), after
			}
			if cited {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d cites a document outside the repository: %s", rel, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestInvariantsNameExistingTests: every test docs/invariants.md names as
// proof of an invariant exists.
func TestInvariantsNameExistingTests(t *testing.T) {
	doc, err := os.ReadFile(repoFile("docs/invariants.md"))
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir(repoFile("."), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		for _, m := range decl.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`(Test\\w+)`").FindAllSubmatch(doc, -1)
	if len(named) == 0 {
		t.Fatal("docs/invariants.md names no test")
	}
	for _, m := range named {
		if !defined[string(m[1])] {
			t.Errorf("docs/invariants.md names %s, which no test file defines", m[1])
		}
	}
}

// TestOperationsReloadTableMatchesKeysRead: the runbook's table of the keys
// each role reads — those whose change a reload names as needing a restart
// — is the one the code consults (app.KeysUsed): for every role, the row
// "any role", the role's own row and the live keys are exactly the keys a
// process of that role reads.
func TestOperationsReloadTableMatchesKeysRead(t *testing.T) {
	doc, err := os.ReadFile(repoFile("docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n### Keys a reload applies, keys that need a restart\n")
	if !ok {
		t.Fatal(`docs/operations.md has no section "Keys a reload applies, keys that need a restart"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| (any role|`([a-z]+)`) \\| (.+) \\|$")
	code := regexp.MustCompile("`([^`]+)`")
	keys := config.Keys()
	// expand turns the entries of a cell into keys: section.* is every key
	// under it, anything else one key that must exist
	expand := func(cell string) []string {
		var out []string
		for _, m := range code.FindAllStringSubmatch(cell, -1) {
			if prefix, ok := strings.CutSuffix(m[1], ".*"); ok {
				n := len(out)
				for _, k := range keys {
					if strings.HasPrefix(k, prefix+".") {
						out = append(out, k)
					}
				}
				if len(out) == n {
					t.Errorf("the reload table names %s, which has no key", m[1])
				}
				continue
			}
			if !slices.Contains(keys, m[1]) {
				t.Errorf("the reload table names %s, which is no key", m[1])
			}
			out = append(out, m[1])
		}
		return out
	}
	live := []string{"log.level", "tenants", "tenants_file"}
	for _, k := range keys {
		if strings.HasPrefix(k, "limits.") {
			live = append(live, k)
		}
	}
	var common []string
	byRole := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		if m[2] == "" {
			common = expand(m[3])
		} else {
			byRole[m[2]] = expand(m[3])
		}
	}
	if len(common) == 0 {
		t.Fatal(`the reload table has no row "any role"`)
	}
	for _, role := range app.Roles() {
		want, err := app.KeysUsed(role)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.Concat(live, common, byRole[role])
		slices.Sort(got)
		got = slices.Compact(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			missing := slices.DeleteFunc(slices.Clone(want), func(k string) bool { return slices.Contains(got, k) })
			extra := slices.DeleteFunc(slices.Clone(got), func(k string) bool { return slices.Contains(want, k) })
			t.Errorf("role %s: the reload table lacks %v and names %v it does not read", role, missing, extra)
		}
	}
}
