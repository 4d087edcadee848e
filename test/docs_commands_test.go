package test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/imshard/imshard/cmd"
	"github.com/imshard/imshard/test/harness"
)

// TestDocumentedCommandsRunAsWritten: every command line README.md and
// docs/ show an operator — in code blocks and inline code — and every
// command's --help example is one the binary takes: each `imshard …`
// names existing commands and flags (with valid values where a value is
// written out, not a placeholder), each systemd unit a `systemctl` or
// `journalctl` line names is the shipped template with a shipped env file
// (or a documented copy of one), and each curl path is a documented route.
func TestDocumentedCommandsRunAsWritten(t *testing.T) {
	docs, err := filepath.Glob(repoFile("docs/*.md"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := harness.LoadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	routes := http.NewServeMux()
	for _, op := range spec.Operations() {
		routes.Handle(op.Pattern, http.NotFoundHandler())
	}
	checked := map[string]int{}
	check := func(where, line string, inline bool) {
		for _, c := range shellCommands(line, inline) {
			var err error
			switch {
			case c.imshard:
				checked["imshard"]++
				err = parseImshard(c.args)
			case c.name == "systemctl" || c.name == "journalctl":
				checked["systemd"]++
				err = checkUnits(c.args)
			case c.name == "curl":
				checked["curl"]++
				err = checkCurl(routes, c.args)
			}
			if err != nil {
				t.Errorf("%s: %s: %v", where, strings.TrimSpace(line), err)
			}
		}
	}
	for _, path := range append([]string{repoFile("README.md")}, docs...) {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoFile("."), path)
		fenced, inline := markdownCode(string(src))
		for _, l := range fenced {
			check(rel, l, false)
		}
		for _, l := range inline {
			check(rel, l, true)
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, l := range joinContinued(strings.Split(c.Example, "\n")) {
			check(c.CommandPath()+" --help", l, false)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.NewRoot(io.Discard, io.Discard, nil))
	// the extraction itself must find what the documents hold, and the
	// checks refuse what the documents once got wrong
	if checked["imshard"] < 100 || checked["systemd"] < 8 || checked["curl"] < 8 {
		t.Fatalf("found too few command lines to check: %v", checked)
	}
	for _, bad := range []string{"imshard route chek", "imshard shard list --bogus", "imshard shard ensure --months=many",
		"systemctl status imshard-shardmgr", "journalctl -u imshard@nosuch", "curl -s $API/v1/nosuch"} {
		c := shellCommands(bad, false)[0]
		var err error
		switch {
		case c.imshard:
			err = parseImshard(c.args)
		case c.name == "curl":
			err = checkCurl(routes, c.args)
		default:
			err = checkUnits(c.args)
		}
		if err == nil {
			t.Errorf("the check takes %q", bad)
		}
	}
}

// TestUnknownCommandsAndFlagsExitTwo: a mistyped command or flag is bad
// usage (exit 2) with the nearest names, never a help page and exit 0.
func TestUnknownCommandsAndFlagsExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"route", "chek"}, "did you mean check?"},
		{[]string{"shard", "lst"}, "did you mean list?"},
		{[]string{"migrate", "stauts"}, "status?"},
		{[]string{"rout", "check"}, "route"},
		{[]string{"shard", "list", "--tenat=acme"}, "did you mean --tenant?"},
		{[]string{"--log-level=loud", "config", "check"}, "--log-level"},
	} {
		code, out := runCLI(t, nil, c.args...)
		if code != 2 || !strings.Contains(out, c.says) {
			t.Errorf("%v: exit %d, want 2 saying %q\n%s", c.args, code, c.says, out)
		}
	}
	if code, out := runCLI(t, nil, "route"); code != 0 || !strings.Contains(out, "Available Commands") {
		t.Errorf("a group command alone shows its help: exit %d\n%s", code, out)
	}
}

// markdownCode returns the lines of the fenced code blocks of a Markdown
// text (continuations joined) and its inline code spans.
func markdownCode(src string) (fenced, inline []string) {
	var prose []string
	var block []string
	in := false
	for _, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			if in {
				fenced = append(fenced, joinContinued(block)...)
				block = nil
			}
			in = !in
			continue
		}
		if in {
			block = append(block, l)
		} else {
			prose = append(prose, l)
		}
	}
	// a span may break across lines of a paragraph, never across a blank one
	for _, para := range strings.Split(strings.Join(prose, "\n"), "\n\n") {
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(para, -1) {
			inline = append(inline, strings.ReplaceAll(m[1], "\n", " "))
		}
	}
	return fenced, inline
}

// joinContinued joins the lines a trailing backslash continues.
func joinContinued(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}

type shellCommand struct {
	name    string
	imshard bool // an invocation of the imshard binary, whatever its path
	args    []string
}

// binaries are the names the documents give the imshard binary; a `go
// build -o NAME` line adds its NAME.
var binaries = regexp.MustCompile(`^(\S*/)?imshard$`)

// shellCommands splits a shell line into its simple commands (at &&, ;, |
// and $( ), without leading VAR=value assignments. In inline code, which
// shows synopses, | separates alternatives rather than commands, and
// brackets mark optional parts.
func shellCommands(line string, inline bool) []shellCommand {
	if i := strings.Index(line, " #"); i >= 0 && !inline {
		line = line[:i]
	}
	line = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(line, "<x>")
	if inline {
		// a value computed by the shell, then the synopsis marks
		line = regexp.MustCompile(`\$\([^)]*\)`).ReplaceAllString(line, "$x")
		line = strings.NewReplacer("[", " ", "]", " ", "(", " ", ")", " ", "\\|", "|").Replace(line)
	}
	seps := regexp.MustCompile(`&&|;|\$\(|\)`)
	if !inline {
		seps = regexp.MustCompile(`&&|;|\||\$\(|\)`)
	}
	built := map[string]bool{}
	var out []shellCommand
	for _, part := range seps.Split(line, -1) {
		words := shellWords(part)
		for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
			words = words[1:]
		}
		if len(words) == 0 {
			continue
		}
		if len(words) >= 4 && words[0] == "go" && words[1] == "build" && words[2] == "-o" {
			built[words[3]] = true
		}
		c := shellCommand{name: words[0], args: words[1:]}
		c.imshard = binaries.MatchString(words[0]) || built[words[0]] || strings.HasPrefix(words[0], "/tmp/imshard")
		if inline && c.imshard && len(c.args) > 0 && strings.Contains(line, "|") {
			out = append(out, alternatives(c)...)
			continue
		}
		out = append(out, c)
	}
	return out
}

// alternatives expands a synopsis word a|b|c into one command per choice.
func alternatives(c shellCommand) []shellCommand {
	for i, w := range c.args {
		if strings.Contains(w, "|") && !strings.HasPrefix(w, "-") {
			var out []shellCommand
			for _, choice := range strings.Split(w, "|") {
				args := append(append(append([]string{}, c.args[:i]...), choice), c.args[i+1:]...)
				out = append(out, alternatives(shellCommand{name: c.name, imshard: true, args: args})...)
			}
			return out
		}
		if strings.HasPrefix(w, "--") && strings.Contains(w, "|") {
			// a flag's alternative values (--role=service|admin) or
			// flags (--topic=X|--all): check each
			var out []shellCommand
			for _, choice := range strings.Split(w, "|") {
				if !strings.HasPrefix(choice, "--") {
					name, _, _ := strings.Cut(w, "=")
					choice = name + "=" + choice
				}
				args := append(append(append([]string{}, c.args[:i]...), choice), c.args[i+1:]...)
				out = append(out, alternatives(shellCommand{name: c.name, imshard: true, args: args})...)
			}
			return out
		}
	}
	return []shellCommand{c}
}

// shellWords splits s at blanks outside quotes, dropping the quotes.
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	word := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, word = r, true
		case r == ' ' || r == '\t':
			if word {
				out = append(out, cur.String())
				cur.Reset()
				word = false
			}
		default:
			cur.WriteRune(r)
			word = true
		}
	}
	if word {
		out = append(out, cur.String())
	}
	return out
}

// placeholder tells a value written as a stand-in (T, YYYYMM, …, <x>, $X)
// from one the flag must accept as written.
func placeholder(v string) bool {
	return v == "" || strings.ContainsAny(v, "…$<>") || regexp.MustCompile(`^[A-Z][A-Z_]*$`).MatchString(v) ||
		regexp.MustCompile(`\b(ID|TIME|DIR)\b`).MatchString(v)
}

// parseImshard checks args against a fresh command tree: every word before
// the flags names a command, every flag exists there, and a value given
// as written parses.
func parseImshard(args []string) error {
	root := cmd.NewRoot(io.Discard, io.Discard, nil)
	var path []string
	i := 0
	for ; i < len(args) && !strings.HasPrefix(args[i], "-"); i++ {
		if !placeholder(args[i]) { // imshard CMD --help
			path = append(path, args[i])
		}
	}
	c, rest, err := root.Find(path)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unknown command %q for %q", rest[0], c.CommandPath())
	}
	c.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	for ; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if placeholder(a) {
				continue
			}
			return fmt.Errorf("%q: a word after the flags", a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := c.Flag(name)
		if f == nil && len(name) == 1 {
			f = c.Flags().ShorthandLookup(name)
		}
		if f == nil {
			return fmt.Errorf("%s has no flag --%s", c.CommandPath(), name)
		}
		if !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			value, hasValue = args[i], true
		}
		if hasValue && !placeholder(value) {
			if err := f.Value.Set(value); err != nil {
				return fmt.Errorf("--%s=%s: %v", name, value, err)
			}
		}
	}
	return nil
}

// unitName is a unit as systemctl and journalctl take it.
var unitName = regexp.MustCompile(`^imshard[@-]`)

// checkUnits checks every imshard unit named: the shipped template
// imshard@.service, with an instance whose env file is shipped (api,
// persist, shardmgr), a documented copy of one (api-2), or a glob.
func checkUnits(args []string) error {
	for _, a := range args {
		if !unitName.MatchString(a) {
			continue
		}
		unit := strings.TrimSuffix(a, ".service")
		instance, ok := strings.CutPrefix(unit, "imshard@")
		if !ok {
			return fmt.Errorf("unit %q: the shipped unit is the template imshard@.service (imshard@api, imshard@persist, imshard@shardmgr)", a)
		}
		if _, err := os.Stat(repoFile("docs/systemd/imshard@.service")); err != nil {
			return err
		}
		if instance == "*" || instance == "" {
			continue
		}
		base := regexp.MustCompile(`-\d+$`).ReplaceAllString(instance, "")
		if _, err := os.Stat(repoFile("docs/systemd/" + base + ".env")); err != nil {
			return fmt.Errorf("unit %q: no docs/systemd/%s.env", a, base)
		}
	}
	return nil
}

// checkCurl checks that the URL of a curl line is a documented route.
func checkCurl(routes *http.ServeMux, args []string) error {
	method := http.MethodGet
	for i, a := range args {
		if a == "-X" && i+1 < len(args) {
			method = args[i+1]
		}
	}
	for _, a := range args {
		if !strings.Contains(a, "/") || strings.HasPrefix(a, "-") || !regexp.MustCompile(`^(https?://)?[^/ ]*(localhost|127\.0\.0\.1|\$API|host)[^/ ]*/`).MatchString(a) {
			continue
		}
		raw := regexp.MustCompile(`^(https?://)?[^/]*`).ReplaceAllString(a, "")
		u, err := url.Parse(raw)
		if err != nil {
			return err
		}
		req, _ := http.NewRequest(method, "http://api"+u.Path, nil)
		if _, pattern := routes.Handler(req); pattern == "" {
			return fmt.Errorf("%s %s is not a route of docs/openapi.yaml", method, u.Path)
		}
		return nil
	}
	return nil
}
