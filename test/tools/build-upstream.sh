#!/usr/bin/env bash
# Builds upstream's Argo CD pull controller, the Go program that
# `make bench-manifestwork` runs next to ours (`--mode=basic`), from its Go
# module at the version pinned in versions.env:
#
#   $CACHE/bin/argocd-pull-integration
#
# The Go toolchain downloads the module from the module proxy and verifies it
# against the checksum database. The build happens in a copy of upstream/ in
# the cache; a stamp holds the hash of what it was built from, so a warm run
# does nothing.
#
# Exit status 3 means the module proxy would not serve the pinned version:
# the benchmark then cannot compare and says so.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${ARGOCD_PULL_CACHE:-$root/.cache}
bin=$cache/bin
mkdir -p "$bin" "$cache/stamps"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# shellcheck source=versions.env
. "$here/versions.env"

log() { printf '[upstream] %s\n' "$*" >&2; }

module=open-cluster-management.io/argocd-pull-integration
version=$ARGOCD_PULL_INTEGRATION_VERSION
out=$bin/argocd-pull-integration
stamp=$cache/stamps/argocd-pull-integration
want=$({ go version; echo "$module@$version"; cat "$here/upstream/go.mod" "$here/build-upstream.sh"; } | sha256sum | cut -c1-16)

if [ -x "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

log "building $module@$version (upstream's controller, for the benchmark)"
t0=$SECONDS
work=$cache/upstream-build
rm -rf "$work" && mkdir -p "$work"
cp "$here/upstream/go.mod" "$work/go.mod"
# The main package moved: cmd/ since the `--mode` flag (basic, controller,
# addon, cleanup) came in; the module root before that.
if ! (cd "$work" && go mod edit -require="$module@$version" && go mod download "$module" 2>"$work/download.log"); then
  log "the module proxy did not serve $module@$version:"
  sed 's/^/[upstream]   /' "$work/download.log" >&2
  log "set ARGOCD_PULL_INTEGRATION_VERSION in test/tools/versions.env to a version it serves"
  exit 3
fi
dir=$(cd "$work" && go list -m -f '{{.Dir}}' "$module")
pkg=$module/cmd
[ -f "$dir/cmd/main.go" ] || pkg=$module
if ! grep -qs '"basic"' "$dir"/cmd/main.go "$dir"/main.go; then
  log "note: $version has no --mode flag; its only mode is what later versions call basic"
fi
(cd "$work" && go build -trimpath -ldflags '-s -w' -o "$out" "$pkg")
echo "$want" > "$stamp"
log "built $out in $((SECONDS - t0))s"
