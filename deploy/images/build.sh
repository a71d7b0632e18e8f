#!/usr/bin/env bash
# Builds the container images of argocd-pull as OCI archives, with no
# container engine, no daemon and no registry:
#
#   target/images/argocd-pull-hub-controller.oci.tar
#   target/images/argocd-pull-spoke-agent.oci.tar
#
# Each image is one layer: the binary Cargo built, the few shared libraries
# it links (taken from Debian's libc6 and libgcc-s1 packages, `apt-get
# download`, nothing installed), Debian's CA certificates, and an
# /etc/passwd naming the non-root user 65532 it runs as. No shell, no
# package manager. The layer and the image are byte-for-byte reproducible
# from the same binary and packages (sorted entries, fixed owners, every
# time stamp set to the commit's).
#
# Tags: <version> (what deploy/ and the Helm chart name) and
# <version>-<commit> (the exact build; "-dirty" when the tree has changes).
#
#   deploy/images/build.sh [--profile release|debug] [--arch amd64|arm64] [--out DIR] [--bin-dir DIR]
#                          [--version V --commit C] [NAME...]
#
# NAME is hub-controller and/or spoke-agent (default: both). The binaries
# must have been built for that profile (`make images` builds them).
# ARGOCD_PULL_IMAGE_GZIP sets the layer's gzip level (default 9; the tests
# use 1 for their much bigger debug binaries). --version and --commit name
# binaries built from another commit of this repository (the upgrade test
# builds the previous release's images that way); by default they are the
# workspace's version and HEAD.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${ARGOCD_PULL_CACHE:-$root/.cache}
profile=release arch=amd64 out=$root/target/images bindir="" version="" commit=""
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bin-dir) bindir=$2; shift 2 ;;
    --version) version=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(hub-controller spoke-agent)

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

case $arch in
  amd64) triple=x86_64-unknown-linux-gnu multiarch=x86_64-linux-gnu ;;
  arm64) triple=aarch64-unknown-linux-gnu multiarch=aarch64-linux-gnu ;;
  *) die "unknown architecture $arch (amd64 or arm64)" ;;
esac
# The host's own target builds into target/<profile>; another into target/<triple>/<profile>.
host=$(rustc -vV | sed -n 's/^host: //p')
target=${CARGO_TARGET_DIR:-$root/target}
if [ -n "$bindir" ]; then :; elif [ "$triple" = "$host" ]; then bindir=$target/$profile; else bindir=$target/$triple/$profile; fi

if { [ -z "$version" ] && [ -n "$commit" ]; } || { [ -n "$version" ] && [ -z "$commit" ]; }; then
  die "--version and --commit go together"
fi
if [ -n "$commit" ]; then
  git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null || die "commit $commit is not in this checkout's history"
  epoch=$(git -C "$root" log -1 --format=%ct "$commit")
  commit=$(git -C "$root" rev-parse --short=12 "$commit")
else
  version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")
  commit=$(git -C "$root" rev-parse --short=12 HEAD)
  git -C "$root" diff --quiet HEAD -- . ':!target' 2>/dev/null || commit=$commit-dirty
  # Reproducible time stamps: the commit's time, not the clock's.
  epoch=$(git -C "$root" log -1 --format=%ct)
fi
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' "$root/Cargo.toml")

# --- the base: Debian's packages, downloaded once per version ---------------
# gcc-12-base only carries libgcc-s1's copyright file. For arm64 on an
# amd64 machine, Debian's cross packages hold the same glibc and libgcc
# built for arm64 (under /usr/aarch64-linux-gnu), with no foreign
# architecture to add to dpkg.
if [ "$arch" = amd64 ]; then
  base_pkgs=(libc6 libgcc-s1 gcc-12-base ca-certificates)
else
  base_pkgs=(libc6-arm64-cross libgcc-s1-arm64-cross ca-certificates)
fi
debs=$cache/images/debs-$arch
base=$cache/images/base-$arch
wanted=$(for p in "${base_pkgs[@]}"; do
  printf '%s=%s\n' "$p" "$(apt-cache policy "$p" | sed -n 's/^  Candidate: //p')"
done)
# One build at a time fetches the base: test binaries build images side by
# side, and a second would remove what the first is unpacking.
mkdir -p "$cache/images"
exec 9>"$cache/images/.lock-$arch"
flock 9
if ! [ -f "$base/.packages" ] || [ "$(cat "$base/.packages")" != "$wanted" ]; then
  grep -q '=(none)$\|=$' <<<"$wanted" && die "no candidate for: $(grep '=(none)$\|=$' <<<"$wanted" | paste -sd' ') (apt-get update first)"
  log "fetching $(paste -sd' ' <<<"$wanted") from the system's package sources"
  rm -rf "$debs" "$base" && mkdir -p "$debs" "$base"
  opts=()
  [ "$(id -u)" = 0 ] && opts=(-o APT::Sandbox::User=root)
  (cd "$debs" && apt-get -q "${opts[@]}" download $wanted >/dev/null)
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$base"; done
  printf '%s\n' "$wanted" > "$base/.packages"
fi
flock -u 9
libdir=$base/lib/$multiarch
[ -d "$libdir" ] || libdir=$base/usr/$multiarch/lib

# needed FILE : the shared libraries FILE links, by soname.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
interp() { readelf -l "$1" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p'; }

# --- one image ---------------------------------------------------------------
# json_str TEXT : TEXT as a JSON string (no control characters expected).
json_str() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
blob() { # blob FILE MEDIATYPE : moves FILE into the layout, prints its descriptor
  local f=$1 mt=$2 d s
  d=$(sha256sum "$f" | cut -d' ' -f1)
  s=$(stat -c %s "$f")
  mv "$f" "$layout/blobs/sha256/$d"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$mt" "$d" "$s"
}

build_image() {
  local name=$1 image=argocd-pull-$1
  local binary=$bindir/$name
  [ -x "$binary" ] || die "$binary is missing: cargo build --profile $profile --bin $name${triple:+ --target $triple}"
  work=$(mktemp -d "${TMPDIR:-/tmp}/argocd-pull-image.XXXXXX")
  local rootfs=$work/rootfs
  layout=$work/layout
  mkdir -p "$rootfs"/{etc/ssl/certs,usr/local/bin,tmp} "$layout/blobs/sha256"
  chmod 1777 "$rootfs/tmp"

  install -m 0755 "$binary" "$rootfs/usr/local/bin/$name"
  # The binary's libraries and their own, resolved inside the base, not the host.
  local queue=("$binary") done_libs=" " f lib
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    for lib in $(needed "$f"); do
      case $done_libs in *" $lib "*) continue ;; esac
      done_libs+="$lib "
      [ -e "$libdir/$lib" ] || die "$name needs $lib, which libc6/libgcc-s1 do not ship: add its package to base_pkgs"
      mkdir -p "$rootfs/lib/$multiarch"
      cp -L "$libdir/$lib" "$rootfs/lib/$multiarch/$lib"
      queue+=("$libdir/$lib")
    done
  done
  local ld
  ld=$(interp "$binary")
  if [ -n "$ld" ]; then # (none for a static binary)
    mkdir -p "$rootfs$(dirname "$ld")"
    # (Debian's /lib64 entry is an absolute symlink: resolve it inside the base.)
    cp -L "$libdir/$(basename "$ld")" "$rootfs$ld"
  fi
  # Licences of what the image carries.
  local p
  for p in "${base_pkgs[@]}"; do
    mkdir -p "$rootfs/usr/share/doc/$p"
    [ -f "$base/usr/share/doc/$p/copyright" ] && cp "$base/usr/share/doc/$p/copyright" "$rootfs/usr/share/doc/$p/"
  done
  # What update-ca-certificates would write, from Debian's Mozilla bundle.
  cat "$base"/usr/share/ca-certificates/mozilla/*.crt > "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
  printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
  mkdir -p "$rootfs/home/nonroot" && chown 65532:65532 "$rootfs/home/nonroot"

  # The layer: sorted, fixed owners and times, no host-specific headers.
  tar -C "$rootfs" --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$work/layer.tar" .
  local diff_id
  diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  local unpacked
  unpacked=$(numfmt --to=iec "$(stat -c %s "$work/layer.tar")")
  gzip -n "-${ARGOCD_PULL_IMAGE_GZIP:-9}" "$work/layer.tar"
  local layer_desc
  layer_desc=$(blob "$work/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)

  local labels
  labels=$(printf '{"org.opencontainers.image.title":%s,"org.opencontainers.image.version":%s,"org.opencontainers.image.revision":%s,"org.opencontainers.image.source":%s,"org.opencontainers.image.licenses":"Apache-2.0","org.opencontainers.image.created":%s}' \
    "$(json_str "$image")" "$(json_str "$version")" "$(json_str "$commit")" "$(json_str "$source_url")" "$(json_str "$created")")
  printf '{"architecture":"%s","os":"linux","created":"%s","config":{"User":"65532:65532","Entrypoint":["/usr/local/bin/%s"],"Env":["PATH=/usr/local/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"WorkingDir":"/","Labels":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"deploy/images/build.sh: %s (%s build) on Debian %s"}]}' \
    "$arch" "$created" "$name" "$labels" "$diff_id" "$created" "$name" "$profile" "$(paste -sd' ' <<<"$wanted")" > "$work/config.json"
  local config_desc
  config_desc=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s],"annotations":%s}' \
    "$config_desc" "$layer_desc" "$labels" > "$work/manifest.json"
  local manifest_desc
  manifest_desc=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)

  # One index entry per tag. ref.name is what podman and skopeo read;
  # io.containerd.image.name is what `ctr images import` names it.
  local entries=() tag
  for tag in "$version" "$version-$commit"; do
    entries+=("${manifest_desc%\}},\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"},\"annotations\":{\"org.opencontainers.image.ref.name\":\"$image:$tag\",\"io.containerd.image.name\":\"docker.io/library/$image:$tag\"}}")
  done
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "$(IFS=,; echo "${entries[*]}")" > "$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"

  mkdir -p "$out"
  local archive=$out/$image.oci.tar
  tar -C "$layout" --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -cf "$archive.tmp" oci-layout index.json blobs
  mv "$archive.tmp" "$archive"
  printf '%s:%s %s:%s-%s\n' "$image" "$version" "$image" "$version" "$commit" > "$out/$image.tags"
  rm -rf "$work"
  log "$archive: $image:$version and :$version-$commit, $(du -h "$archive" | cut -f1) ($unpacked unpacked)"
}

work=""
trap 'rm -rf "$work"' EXIT
for n in "${names[@]}"; do
  case $n in
    hub-controller|spoke-agent) build_image "$n" ;;
    # The harness's sandbox image (test/tools/node/pause.c) and its pod
    # that writes a line a second (test/tools/node/ticker.c), for its nodes.
    pause|ticker) build_image "$n" ;;
    *) die "unknown image $n (hub-controller or spoke-agent)" ;;
  esac
done
