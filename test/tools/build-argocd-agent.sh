#!/usr/bin/env bash
# Builds argocd-agent, the gRPC peer `make bench-grpc` runs next to ours
# (principal on the hub, agent on the spoke, managed mode, mTLS), at the
# version pinned in versions.env:
#
#   $CACHE/bin/argocd-agent      (`principal` and `agent` subcommands)
#   $CACHE/bin/argocd-agentctl   (its CLI; the benchmark makes its own PKI)
#   $CACHE/bin/argocd-agent-fleet (argocd-pull's load generator for the
#                                 fleet side by side: many of argocd-agent's
#                                 own agents in one process, from
#                                 test/tools/argocd-agent-fleet/main.go, built
#                                 inside the temporary copy of the tree
#                                 because it uses its internal packages)
#
# Where the source comes from, first choice first:
#   1. the Go module github.com/argoproj-labs/argocd-agent@$VERSION from the
#      module proxy;
#   2. ARGOCD_AGENT_SRC=<dir>: an unpacked copy of the pinned tag;
#   3. a shallow clone of the pinned tag from GitHub.
# One dependency, golang.stackrox.io/grpc-http1 (v0.5.1 at the pinned tag),
# is refused by the module proxy on some machines: GRPC_HTTP1_SRC=<dir> (an
# unpacked copy of github.com/stackrox/go-grpc-http1 at that tag) or a clone
# of that tag replaces it, in the temporary copy only. docs/benchmarks.md
# says how to get both trees on a machine without GitHub. Nothing of
# argocd-agent's code enters this repository.
#
# Exit status 3: no source could be had; the benchmark then says `not run`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh" argocd-agent

module=github.com/argoproj-labs/argocd-agent
repo=https://github.com/argoproj-labs/argocd-agent
http1_module=golang.stackrox.io/grpc-http1
http1_repo=https://github.com/stackrox/go-grpc-http1
version=$ARGOCD_AGENT_VERSION
stamp=$cache/stamps/argocd-agent
src=${ARGOCD_AGENT_SRC:-}
http1_src=${GRPC_HTTP1_SRC:-}
fleet_src=$here/argocd-agent-fleet/main.go
want=$({ go version; echo "$module@$version"; cat "$here/build-argocd-agent.sh" "$here/common.sh" "$fleet_src"; } | sha256sum | cut -c1-16)

if [ -x "$bin/argocd-agent" ] && [ -x "$bin/argocd-agentctl" ] && [ -x "$bin/argocd-agent-fleet" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

t0=$SECONDS
work=$cache/argocd-agent-build
rm -rf "$work" && mkdir -p "$work"

# clone URL TAG DIR : a shallow clone of one tag, where GitHub answers.
clone() {
  GIT_TERMINAL_PROMPT=0 timeout 20 git ls-remote --exit-code --tags "$1" "$2" >/dev/null 2>&1 || return 1
  git -c advice.detachedHead=false clone -q --depth 1 --branch "$2" "$1" "$3"
}

# 1. The module proxy: the module's own tree, copied so it can be edited.
dir=$work/src
if (cd "$work" && GOFLAGS= go mod download -json "$module@$version" >"$work/download.json" 2>&1); then
  mdir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/download.json")
  cp -r "$mdir" "$dir"
  log "building $module@$version from the module proxy"
else
  log "the module proxy did not serve $module@$version"
  if [ -z "$src" ]; then
    clone "$repo" "$version" "$work/clone" && src=$work/clone
  fi
  if [ -z "$src" ] || [ ! -f "$src/go.mod" ] || ! grep -q "^module $module\$" "$src/go.mod"; then
    log "no source for $version: set ARGOCD_AGENT_SRC to an unpacked copy of tag $version (docs/benchmarks.md)"
    exit 3
  fi
  cp -r "$src" "$dir"
  log "building $module $version from the source tree $src"
fi
chmod -R u+w "$dir"

# The grpc-http1 dependency: from the proxy if it serves it, else a tree.
http1_version=$(awk -v m="$http1_module" '$1 == m { print $2 }' "$dir/go.mod")
if [ -n "$http1_version" ] && ! (cd "$work" && GOFLAGS= go mod download "$http1_module@$http1_version" >/dev/null 2>&1); then
  log "the module proxy did not serve $http1_module@$http1_version"
  if [ -z "$http1_src" ]; then
    clone "$http1_repo" "$http1_version" "$work/http1" && http1_src=$work/http1
  fi
  if [ -z "$http1_src" ] || ! grep -q "^module $http1_module\$" "$http1_src/go.mod" 2>/dev/null; then
    log "set GRPC_HTTP1_SRC to an unpacked copy of github.com/stackrox/go-grpc-http1 tag $http1_version (docs/benchmarks.md)"
    exit 3
  fi
  cp -r "$http1_src" "$work/grpc-http1"
  (cd "$dir" && go mod edit -replace "$http1_module=$work/grpc-http1")
  log "using $http1_module from $http1_src (replace in the temporary copy only)"
fi

(cd "$dir" && go build -trimpath -ldflags "-s -w -X $module/internal/version.version=$version" -o "$bin/argocd-agent" ./cmd/argocd-agent \
  && go build -trimpath -ldflags '-s -w' -o "$bin/argocd-agentctl" ./cmd/ctl)
mkdir -p "$dir/cmd/argocd-pull-fleet"
cp "$fleet_src" "$dir/cmd/argocd-pull-fleet/main.go"
(cd "$dir" && go build -trimpath -ldflags "-s -w -X $module/internal/version.version=$version" -o "$bin/argocd-agent-fleet" ./cmd/argocd-pull-fleet)
echo "$want" > "$stamp"
log "built $bin/argocd-agent, $bin/argocd-agentctl and $bin/argocd-agent-fleet in $((SECONDS - t0))s"
