# Sourced by the build scripts in this folder, after `set -euo pipefail`
# and `here=<this folder>`: where the cache is, the Go settings every Go
# build here uses, the pinned versions, and `log` with the script's tag:
#
#   . "$here/common.sh" <tag>
# shellcheck shell=bash

root=$(cd "$here/../.." && pwd)
cache=${ARGOCD_PULL_CACHE:-$root/.cache}
bin=$cache/bin
mkdir -p "$bin" "$cache/stamps"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

# shellcheck source=versions.env
. "$here/versions.env"

log_tag=$1
log() { printf '[%s] %s\n' "$log_tag" "$*" >&2; }
