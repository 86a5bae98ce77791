#!/usr/bin/env bash
# Build Jaeger v2 (all-in-one `jaeger` binary) from its Go module, for the end-to-end test.
#
#   bash collector/build-jaeger.sh      # prints the binary path on stdout (progress goes to stderr)
#
# Jaeger's v1.x module tags carry the v2 binary (cmd/jaeger). `go install ...@version` refuses a
# module whose go.mod has a `replace` directive, so a two-line wrapper module repeats Jaeger's own
# `replace` and builds cmd/jaeger as a tool. The result lives in the build cache outside the
# repository, ${KAOS_BUILD_CACHE:-$HOME/.cache/kaos-otel}/jaeger-<version>/jaeger, so a second run
# on the same machine reuses it. FORCE=1 rebuilds. Cold build on 2 cores: several minutes.
set -euo pipefail

# Pinned: the module tag v1.76.0 is Jaeger v2.13.
JAEGER_MODULE_VERSION="${JAEGER_MODULE_VERSION:-v1.76.0}"
# Jaeger's go.mod at that tag has exactly this replace directive; the wrapper must repeat it.
JAEGER_REPLACE="github.com/Shopify/sarama => github.com/Shopify/sarama v1.33.0"

CACHE="${KAOS_BUILD_CACHE:-$HOME/.cache/kaos-otel}"
OUT="$CACHE/jaeger-$JAEGER_MODULE_VERSION"
BIN="$OUT/jaeger"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || { echo "build-jaeger.sh: the 'go' command is required (Go >= 1.24)" >&2; exit 1; }

if [[ "${FORCE:-0}" != "1" && -x "$BIN" ]]; then
  echo "build-jaeger.sh: $BIN is up to date" >&2
  echo "$BIN"
  exit 0
fi

echo "build-jaeger.sh: building $BIN (several minutes the first time)" >&2
start=$SECONDS
rm -rf "$OUT/wrapper" "$BIN"
mkdir -p "$OUT/wrapper"
(
  cd "$OUT/wrapper"
  cat >go.mod <<MOD
module kaos-otel/jaeger-build

go 1.24.6

replace $JAEGER_REPLACE
MOD
  export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION" >&2
  go build -trimpath -o "$BIN.tmp" github.com/jaegertracing/jaeger/cmd/jaeger >&2
)
mv "$BIN.tmp" "$BIN"
echo "build-jaeger.sh: built in $((SECONDS - start)) s" >&2
echo "$BIN"
