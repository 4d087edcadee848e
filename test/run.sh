#!/usr/bin/env bash
# The test command: bash test/run.sh [extra go test args, e.g. -run X -v]
# Brings up MariaDB and Redis and installs the test tools (test/services.sh --test-tools),
# then gofmt, go vet, staticcheck, deadcode, the OpenAPI linter and the race-enabled tests:
# about 15 minutes on a quiet 2-core machine, most of it in `go test` of ./test, which prints
# nothing until its package ends.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v go >/dev/null 2>&1 || { echo "run.sh: Go >= 1.26 is needed and 'go' is not on PATH (https://go.dev/dl/)" >&2; exit 1; }
bash test/services.sh --test-tools
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "run.sh: gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
# Product code that nothing reaches, not even a test, is dead: deadcode lists it. Only the
# product packages are held to it; test/ is tooling.
dead=$(go run golang.org/x/tools/cmd/deadcode@v0.53.0 -test \
  -filter '^github.com/imshard/imshard($|/(app|cmd|config|modules|sql|lua)(/|$))' ./...)
[ -z "$dead" ] || { echo "run.sh: unreachable product code:" >&2; echo "$dead" >&2; exit 1; }
# docs/openapi.yaml under an independent linter (Redocly CLI, pinned and cached by
# --test-tools above): clients generated from it must read the answers the service sends.
lint=$(bash test/tools/openapi-lint/lint.sh 2>&1) || {
  echo "$lint" >&2; echo "run.sh: docs/openapi.yaml fails the OpenAPI linter (bash test/tools/openapi-lint/lint.sh)" >&2; exit 1
}
# Bounded fuzzing: every fuzz target of the repository for FUZZTIME each (default 2000x:
# 2,000 executions, a few seconds at most; a count, not a duration, because Go 1.26's fuzz
# coordinator can fail a duration-bounded run with "context deadline exceeded" when a loaded
# machine starves its workers at the deadline — golang/go#75804), beyond its seed corpus, which the plain test run below replays anyway; 0
# skips this step. (Not IMSHARD_*: the service reads every IMSHARD_ variable as config and
# refuses unknown ones, so such a name would break the tests that start it.) Each package's fuzzing binary is built once; a failing input is saved under
# the package's testdata/fuzz/<target>/ (commit it: it becomes a seed).
fuzztime=${FUZZTIME:-2000x}
if [ "$fuzztime" != 0 ]; then
  fuzzbin=$(mktemp -d)
  for dir in $(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' | xargs -n1 dirname | sort -u); do
    go test -c -fuzz=. -o "$fuzzbin/fuzz.test" "./$dir"
    cache="$(go env GOCACHE)/fuzz/$(go list "./$dir")"
    for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$dir"/*_test.go); do
      (cd "$dir" && "$fuzzbin/fuzz.test" -test.run='^$' -test.fuzz="^${target}\$" -test.fuzztime="$fuzztime" \
        -test.fuzzcachedir="$cache" >"$fuzzbin/out" 2>&1) ||
        { cat "$fuzzbin/out" >&2; echo "run.sh: fuzz target $target in ./$dir failed" >&2; exit 1; }
    done
  done
  rm -rf "$fuzzbin"
fi
# 20m: the test package holds the 200,000-row migration acceptance test (a few minutes on a
# loaded 2-core machine) beside the others
exec go test -race -count=1 -timeout 20m ./... "$@"
