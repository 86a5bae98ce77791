#!/usr/bin/env bash
# Build the kaos-otel collector distribution from collector/builder-config.yaml.
#
#   bash collector/build.sh               # prints the binary path on stdout (progress on stderr)
#   bash collector/build.sh telemetrygen  # the collector project's load generator, same release
#
# The build lives OUTSIDE the repository, in a cache directory named by the manifest's hash:
#   ${KAOS_BUILD_CACHE:-$HOME/.cache/kaos-otel}/otelcol-<hash>/kaos-otelcol
# so a fresh clone on the same machine (a second CI run, another worktree) reuses it. The
# builder (ocb) is installed with `go install` into ${KAOS_BUILD_CACHE}/ocb-<version>/.
# collector/_build/kaos-otelcol is a symlink to the cached binary (the path tests and docs use).
# Idempotent: a finished build for the same manifest and builder version is never redone; FORCE=1
# rebuilds anyway. Concurrent runs for the same manifest wait for each other (flock).
# Cold build on 2 cores: several minutes (module download + compile); warm Go cache: ~1-2 min.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MANIFEST="$HERE/builder-config.yaml"
# The builder release must match the collector release pinned in the manifest.
BUILDER_VERSION="${OCB_VERSION:-v0.161.0}"
CACHE="${KAOS_BUILD_CACHE:-$HOME/.cache/kaos-otel}"
BUILDER_DIR="$CACHE/ocb-$BUILDER_VERSION"
BUILDER="$BUILDER_DIR/builder"
HASH="$( (cat "$MANIFEST"; echo "builder=$BUILDER_VERSION") | sha256sum | cut -c1-16)"
OUT="$CACHE/otelcol-$HASH"
BIN="$OUT/kaos-otelcol"
DONE="$OUT/.built"
LINK="$HERE/_build/kaos-otelcol"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  export PATH="/usr/local/go/bin:$PATH"
fi

# Point collector/_build/kaos-otelcol at the cached binary (replacing an older in-repo build).
link_and_print() {
  if [[ "$(readlink "$LINK" 2>/dev/null)" != "$BIN" ]]; then
    rm -rf "$HERE/_build"
    mkdir -p "$HERE/_build"
    ln -s "$BIN" "$LINK"
  fi
  echo "$BIN"
}

mkdir -p "$CACHE"
# telemetrygen (bench/gateway.py): installed with `go install` at the collector release.
if [[ "${1:-}" == "telemetrygen" ]]; then
  TG="$CACHE/telemetrygen-$BUILDER_VERSION/telemetrygen"
  mkdir -p "$(dirname "$TG")"
  exec 9>"$TG.lock"
  flock 9
  if [[ ! -x "$TG" ]]; then
    echo "build.sh: installing telemetrygen@$BUILDER_VERSION" >&2
    GOBIN="$(dirname "$TG")" CGO_ENABLED=0 go install \
      "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen@$BUILDER_VERSION" >&2
  fi
  echo "$TG"
  exit 0
fi
exec 9>"$OUT.lock"
flock 9
if [[ "${FORCE:-0}" != "1" && -x "$BIN" && -f "$DONE" ]]; then
  echo "build.sh: $BIN is up to date" >&2
  link_and_print
  exit 0
fi
command -v go >/dev/null 2>&1 || { echo "build.sh: the 'go' command is required (Go >= 1.24)" >&2; exit 1; }

if [[ ! -x "$BUILDER" ]]; then
  echo "build.sh: installing go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
  mkdir -p "$BUILDER_DIR"
  GOBIN="$BUILDER_DIR" go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
fi

echo "build.sh: building $BIN (this takes a few minutes the first time)" >&2
rm -rf "$OUT"
mkdir -p "$OUT"
start=$SECONDS
# output_path in the manifest is "." : the builder runs in the cache directory.
(
  cd "$OUT"
  export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
  "$BUILDER" --config "$MANIFEST" >&2
)
[[ -x "$BIN" ]] || { echo "build.sh: builder finished but $BIN is missing" >&2; exit 1; }
"$BIN" --version >&2
touch "$DONE"
echo "build.sh: built in $((SECONDS - start)) s" >&2
link_and_print
