#!/usr/bin/env bash
# bash test/tools/openapi-lint/lint.sh [--install]
#
# Lints docs/openapi.yaml with Redocly CLI at the exact version package-lock.json
# pins, under redocly.yaml (rule choices) and .redocly.lint-ignore.yaml (the
# few findings that describe the service correctly, each with its reason). Any
# finding fails (exit 1). test/run.sh runs it; test/services.sh --test-tools
# installs it (--install: install only, no lint).
#
# The linter is installed once with `npm ci` into a cache outside the work tree,
# named after package-lock.json's digest: later runs, and a clean clone on the
# same machine, reuse it without the network; changing the pin installs anew.
#   OPENAPI_LINT_CACHE  (not IMSHARD_*: the service reads those as config) default ${XDG_CACHE_HOME:-$HOME/.cache}/imshard-openapi-lint
# Needs Node.js 20.19+ (or 22.12+) and npm, the versions the pinned CLI runs on.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
die() { echo "openapi-lint: ERROR: $*" >&2; exit 1; }

case "${1:-}" in
  "") install_only=0 ;;
  --install) install_only=1 ;;
  *) die "unknown argument $1 (usage: bash test/tools/openapi-lint/lint.sh [--install])" ;;
esac

command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
  die "node and npm are needed (Node.js 20.19+ or 22.12+); bash test/services.sh --test-tools installs them"
node -e '
  const [maj, min] = process.versions.node.split(".").map(Number);
  process.exit((maj === 20 && min >= 19) || (maj === 22 && min >= 12) || maj > 22 ? 0 : 1);' ||
  die "Node.js $(node --version) is too old for the pinned Redocly CLI: it needs 20.19+ or 22.12+"

cache="${OPENAPI_LINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/imshard-openapi-lint}"
dir="$cache/$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)"
cli="$dir/node_modules/@redocly/cli/bin/cli.js"
if [ ! -f "$cli" ]; then
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/install.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  cp "$here/package.json" "$here/package-lock.json" "$tmp/"
  (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2 ||
    die "npm ci of the pinned Redocly CLI failed (the npm registry must be reachable once)"
  # Whole or not at all: a run cut short never leaves a half-installed cache.
  mv -T "$tmp" "$dir" 2>/dev/null || [ -f "$cli" ] || die "could not move the install into $dir"
  echo "openapi-lint: installed Redocly CLI $(node -p "require('$dir/node_modules/@redocly/cli/package.json').version") in $dir"
fi
[ "$install_only" = 0 ] || exit 0

cd "$root"
# No telemetry and no update check: the suite reaches no server but the registry.
REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  node "$cli" lint --config "$here/redocly.yaml" --format stylish docs/openapi.yaml
