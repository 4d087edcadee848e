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
exec go test -race -count=1 -timeout 12m ./... "$@"
