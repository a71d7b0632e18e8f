#!/usr/bin/env bash
# Generates the Rust code of the wire contract (proto/src/gen/) from the
# .proto files under proto/, with the pure-Rust protox compiler (no protoc)
# and tonic-prost-build, both pinned in the workspace's Cargo.lock. The output
# is checked in; never edit it by hand.
#
#   proto/generate.sh          regenerate proto/src/gen/*.rs
#   proto/generate.sh --check  fail if the checked-in files differ
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out=$here/src/gen

cargo build --quiet --locked --manifest-path "$root/Cargo.toml" -p argocd-pull-proto-gen
target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" \
  | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$target/debug/proto-gen" "$here" "$tmp"
rustfmt --edition 2024 "$tmp"/*.rs

if [ "${1:-}" = "--check" ]; then
  if ! changes=$(diff -ru "$out" "$tmp" 2>&1); then
    head -n 40 <<<"$changes" >&2
    echo "[generate] proto/src/gen/ is out of date with the .proto files: run \`make generate\` (or \`bash proto/generate.sh\`)" >&2
    exit 1
  fi
  exit 0
fi
rm -rf "$out"
mkdir -p "$out"
cp "$tmp"/*.rs "$out/"
echo "[generate] wrote $(ls "$tmp" | wc -l) file(s) to proto/src/gen" >&2
