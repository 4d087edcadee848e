package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
