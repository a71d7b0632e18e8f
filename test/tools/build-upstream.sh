#!/usr/bin/env bash
# Builds upstream's Argo CD pull controller, the Go program that
# `make bench-manifestwork` runs next to ours (`--mode=basic`), at the version
# pinned in versions.env:
#
#   $CACHE/bin/argocd-pull-integration
#
# Where the source comes from, first choice first:
#   1. the Go module open-cluster-management.io/argocd-pull-integration@$VERSION
#      from the module proxy (checksum-verified);
#   2. UPSTREAM_SRC=<dir>: an unpacked copy of the pinned tag (see
#      docs/benchmarks.md, "Getting the peers' source", for a machine without
#      GitHub);
#   3. a shallow clone of the pinned tag from GitHub.
# Nothing of upstream's code enters this repository: the build happens in a
# copy under the git-ignored cache. A stamp holds the hash of what it was
# built from, so a warm run does nothing.
#
# Exit status 3: no source could be had; the benchmark then says `not run`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh" upstream

module=open-cluster-management.io/argocd-pull-integration
repo=https://github.com/open-cluster-management-io/argocd-pull-integration
version=$ARGOCD_PULL_INTEGRATION_VERSION
out=$bin/argocd-pull-integration
stamp=$cache/stamps/argocd-pull-integration
src=${UPSTREAM_SRC:-}
want=$({ go version; echo "$module@$version"; cat "$here/upstream/go.mod" "$here/build-upstream.sh" "$here/common.sh"; } | sha256sum | cut -c1-16)

if [ -x "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

t0=$SECONDS
work=$cache/upstream-build
rm -rf "$work" && mkdir -p "$work"

# 1. The module proxy.
cp "$here/upstream/go.mod" "$work/go.mod"
dir=
if (cd "$work" && go mod edit -require="$module@$version" && go mod download "$module" 2>"$work/download.log"); then
  dir=$(cd "$work" && go list -m -f '{{.Dir}}' "$module")
  log "building $module@$version from the module proxy"
else
  log "the module proxy did not serve $module@$version: $(tail -1 "$work/download.log")"
fi

# 2. A source tree given by the user; 3. a clone of the tag.
if [ -z "$dir" ]; then
  rm -rf "$work" && mkdir -p "$work"
  if [ -z "$src" ] && GIT_TERMINAL_PROMPT=0 timeout 20 git ls-remote --exit-code --tags "$repo" "$version" >/dev/null 2>&1; then
    src=$work/clone
    git -c advice.detachedHead=false clone -q --depth 1 --branch "$version" "$repo" "$src"
  fi
  if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
    log "no source for $version: set UPSTREAM_SRC to an unpacked copy of tag $version (docs/benchmarks.md)"
    exit 3
  fi
  if ! grep -q "^module $module\$" "$src/go.mod"; then
    log "$src/go.mod is not module $module"
    exit 3
  fi
  # Build in a copy so that `go` never writes into the user's tree.
  dir=$work/src
  cp -r "$src" "$dir"
  chmod -R u+w "$dir"
  log "building $module $version from the source tree $src"
fi

# The main package moved: cmd/ since the `--mode` flag (basic, controller,
# addon, cleanup) came in; the module root before that.
pkg=./cmd
[ -f "$dir/cmd/main.go" ] || pkg=.
if ! grep -qs '"basic"' "$dir"/cmd/main.go "$dir"/main.go; then
  log "note: $version has no --mode flag; its only mode is what later versions call basic"
fi
if [ "${dir#"$work"}" != "$dir" ]; then
  (cd "$dir" && go build -trimpath -ldflags '-s -w' -o "$out" "$pkg")
else
  # From the module cache: build it as a dependency of the stub module.
  target=$module
  [ "$pkg" = . ] || target=$module/${pkg#./}
  (cd "$work" && go build -trimpath -ldflags '-s -w' -o "$out" "$target")
fi
echo "$want" > "$stamp"
log "built $out in $((SECONDS - t0))s"
