#!/usr/bin/env bash
# Build the kaos-otel collector distribution from collector/builder-config.yaml.
#
#   bash collector/build.sh          # prints the binary path on stdout (progress goes to stderr)
#
# Installs the OpenTelemetry Collector Builder (ocb) with `go install` into collector/_build/bin
# and builds collector/_build/kaos-otelcol. Idempotent: if the binary exists and was built from
# the same manifest (sha256 recorded in collector/_build/.manifest.sha256) nothing is rebuilt.
# FORCE=1 rebuilds anyway. Cold build on 2 cores: a few minutes (module download + compile).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MANIFEST="$HERE/builder-config.yaml"
OUT="$HERE/_build"
BIN="$OUT/kaos-otelcol"
STAMP="$OUT/.manifest.sha256"
# The builder release must match the collector release pinned in the manifest.
BUILDER_VERSION="${OCB_VERSION:-v0.161.0}"
BUILDER="$OUT/bin/builder"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || { echo "build.sh: the 'go' command is required (Go >= 1.24)" >&2; exit 1; }

want="$( (cat "$MANIFEST"; echo "builder=$BUILDER_VERSION") | sha256sum | cut -d' ' -f1)"
if [[ "${FORCE:-0}" != "1" && -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "build.sh: $BIN is up to date" >&2
  echo "$BIN"
  exit 0
fi

mkdir -p "$OUT/bin"
if [[ ! -x "$BUILDER" || "$(cat "$OUT/bin/.builder-version" 2>/dev/null)" != "$BUILDER_VERSION" ]]; then
  echo "build.sh: installing go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
  GOBIN="$OUT/bin" go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
  echo "$BUILDER_VERSION" >"$OUT/bin/.builder-version"
fi

echo "build.sh: building $BIN (this takes a few minutes the first time)" >&2
rm -f "$STAMP"
start=$SECONDS
# output_path in the manifest is relative: run from collector/.
(
  cd "$HERE"
  export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
  "$BUILDER" --config "$MANIFEST" >&2
)
[[ -x "$BIN" ]] || { echo "build.sh: builder finished but $BIN is missing" >&2; exit 1; }
"$BIN" --version >&2
echo "$want" >"$STAMP"
echo "build.sh: built in $((SECONDS - start)) s" >&2
echo "$BIN"
