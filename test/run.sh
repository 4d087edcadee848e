#!/usr/bin/env bash
# The test command: bash test/run.sh [extra go test args, e.g. -run X -v]
# Brings up MariaDB and Redis (test/services.sh), then gofmt, go vet, staticcheck and the
# race-enabled tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v go >/dev/null 2>&1 || { echo "run.sh: Go >= 1.26 is needed and 'go' is not on PATH (https://go.dev/dl/)" >&2; exit 1; }
bash test/services.sh
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "run.sh: gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
# Bounded fuzzing: every fuzz target of the repository for IMSHARD_FUZZTIME (default 2s) each,
# beyond its seed corpus (which the plain test run below replays anyway); 0 skips this step.
fuzztime=${IMSHARD_FUZZTIME:-2s}
if [ "$fuzztime" != 0 ]; then
  for file in $(git ls-files '*_test.go'); do
    for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
      go test -run '^$' -fuzz "^${target}\$" -fuzztime="$fuzztime" "./$(dirname "$file")" >/dev/null ||
        { echo "run.sh: fuzz target $target in ./$(dirname "$file") failed (its failing input is under testdata/fuzz/$target):" >&2
          go test -run "^${target}\$" "./$(dirname "$file")" >&2; exit 1; }
    done
  done
fi
exec go test -race -count=1 -timeout 12m ./... "$@"
