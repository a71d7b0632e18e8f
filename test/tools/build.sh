#!/usr/bin/env bash
# Builds the real components the tests run against, from their upstream Go
# modules, into the git-ignored cache, and collects the upstream CRDs:
#
#   $CACHE/bin/{etcd,kube-apiserver,kube-controller-manager,kubectl}
#   $CACHE/bin/ocm/{registration,work,placement,addon}   (OCM hub and klusterlet)
#   $CACHE/bin/clusteradm
#   $CACHE/bin/argocd        (Argo CD's application-controller, repo-server
#                             and applicationset-controller in one binary)
#   $CACHE/bin/argocd-server (the hub's Argo CD API server; $CACHE/bin/argocd-cli/argocd,
#                             Argo CD's CLI, is the same binary)
#   $CACHE/argocd-ui/        (Argo CD's web UI, built from the module's ui/ sources;
#                             argocd-server embeds it)
#   chromium                 (Debian's, installed as a system package when missing)
#   $CACHE/bin/redis-server  (Debian's redis, unpacked into $CACHE/redis)
#   $CACHE/bin/runc          (Debian's runc, unpacked into $CACHE/runc)
#   $CACHE/bin/tinyproxy     (Debian's, unpacked into $CACHE/tinyproxy: the
#                             agent's egress proxy in hub-controller/tests/grpc_proxy.rs)
#   $CACHE/bin/nginx         (Debian's nginx, unpacked into $CACHE/nginx: the
#                             HTTP/1.1-only proxy in hub-controller/tests/grpc_websocket.rs)
#   $CACHE/bin/iptables{,-restore,-save} (Debian's, unpacked into $CACHE/iptables)
#   $CACHE/bin/helm
#   $CACHE/bin/promtool
#   $CACHE/bin/{kubelet,kube-scheduler}, $CACHE/bin/node/{containerd,containerd-shim-runc-v2,ctr,cni/*}
#   $CACHE/previous/bin/{hub-controller,spoke-agent} (the previous release of
#                             our own, from this repository's history)
#   $CACHE/crds/{hub,managed}/*.yaml
#   $CACHE/ocm/*.yaml                                    (OCM's bootstrap RBAC)
#
# Each part is rebuilt only when its pins change (a stamp holds the hash of
# what it was built from: its go.mod, go.sum and the function that builds
# it), so a warm run takes a second.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh" tools

# stamp NAME FILES... : succeeds when NAME was already built from exactly these inputs.
stamp_of() { { go version; cat "$@"; } | sha256sum | cut -c1-16; }
fresh() {
  local name=$1; shift
  [ -f "$cache/stamps/$name" ] && [ "$(cat "$cache/stamps/$name")" = "$(stamp_of "$@")" ]
}
mark() { local name=$1; shift; stamp_of "$@" > "$cache/stamps/$name"; }

# A word before a full disk fails a build in the middle of some compiler's
# output (a CI run once ended in jemalloc's C build with nothing else said).
# A warning only: what is needed depends on what is already built.
check_disk() {
  local need=${ARGOCD_PULL_MIN_FREE_GIB:-15} free
  free=$(df -Pk "$cache" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free" -lt "$need" ]; then
    log "WARNING: $free GiB free on the disk of $cache; a cold build (these tools, Go's build cache, the Rust target/ folder) with its test clusters takes about $need GiB, and a build that runs out fails with 'No space left on device', often deep in a compiler's output. Free some (cargo clean; rm -rf $cache/run/bench-logs) or set ARGOCD_PULL_CACHE to a larger disk."
  fi
}

build_etcd() {
  local m=$here/etcd
  if fresh etcd "$m/go.mod" "$m/go.sum" "$m/main.go" && [ -x "$bin/etcd" ]; then return; fi
  log "building etcd from $(grep 'etcd/server/v3 ' "$m/go.mod" | xargs)"
  local t0=$SECONDS
  (cd "$m" && go build -trimpath -ldflags '-s -w' -o "$bin/etcd" .)
  mark etcd "$m/go.mod" "$m/go.sum" "$m/main.go"
  log "etcd built in $((SECONDS - t0))s"
}

build_kube() {
  local m=$here/kube
  if fresh kube "$m/go.mod" "$m/go.sum" <(declare -f build_kube) \
    && [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kubectl" ]; then
    return
  fi
  local v minor
  v=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$m/go.mod")
  minor=$(echo "$v" | cut -d. -f2)
  log "building kube-apiserver, kube-controller-manager and kubectl $v (about 5 minutes on 2 cores when cold)"
  local t0=$SECONDS
  local pkg=k8s.io/component-base/version
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
    -o "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
  mark kube "$m/go.mod" "$m/go.sum" <(declare -f build_kube)
  log "kubernetes built in $((SECONDS - t0))s"
}

# module_dir MODULE@VERSION : downloads (verified) and prints the module's directory.
module_dir() {
  (cd "$cache" && GOFLAGS= go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

collect_crds() {
  if fresh crds "$here/versions.env" <(declare -f collect_crds) && [ -d "$cache/crds/hub" ]; then return; fi
  log "collecting CRDs from open-cluster-management.io/api@$OCM_API_VERSION and github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION"
  local ocm argo
  ocm=$(module_dir "open-cluster-management.io/api@$OCM_API_VERSION")
  argo=$(module_dir "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION")
  [ -n "$ocm" ] && [ -n "$argo" ] || { log "could not download the CRD modules"; exit 1; }
  rm -rf "$cache/crds" && mkdir -p "$cache/crds/hub" "$cache/crds/managed"
  local argocd_crds=("$argo"/manifests/crds/application-crd.yaml
    "$argo"/manifests/crds/appproject-crd.yaml
    "$argo"/manifests/crds/applicationset-crd.yaml)
  # The hub gets what OCM's cluster-manager serves. The addon CRDs are taken
  # in their v1alpha1-only form: the v1beta1 form needs OCM's conversion webhook.
  cp "${argocd_crds[@]}" \
    "$ocm"/cluster/v1/*managedclusters.crd.yaml \
    "$ocm"/cluster/v1beta2/*managedclustersets.crd.yaml \
    "$ocm"/cluster/v1beta2/*managedclustersetbindings.crd.yaml \
    "$ocm"/cluster/v1beta1/*placements.crd.yaml \
    "$ocm"/cluster/v1beta1/*placementdecisions.crd.yaml \
    "$ocm"/cluster/v1alpha1/*addonplacementscores.crd.yaml \
    "$ocm"/work/v1/*_manifestworks.crd.yaml \
    "$ocm"/addon/v1alpha1/*.crd.yaml \
    "$cache/crds/hub/"
  # A managed cluster gets what the klusterlet installs, plus Argo CD's own.
  cp "${argocd_crds[@]}" \
    "$ocm"/work/v1/*appliedmanifestworks.crd.yaml \
    "$ocm"/cluster/v1alpha1/*clusterclaims.crd.yaml \
    "$cache/crds/managed/"
  chmod -R u+w "$cache/crds"
  mark crds "$here/versions.env" <(declare -f collect_crds)
}

# The OCM hub components and klusterlet agents, run by the harness as
# processes (testenv::ocm). Their OCM API release must be the one whose CRDs
# collect_crds installs.
build_ocm() {
  local m=$here/ocm out=$bin/ocm
  local api
  api=$(awk '$1 == "open-cluster-management.io/api" { print $2 }' "$m/go.mod")
  if [ "$api" != "$OCM_API_VERSION" ]; then
    log "test/tools/ocm/go.mod uses open-cluster-management.io/api $api but versions.env installs the CRDs of $OCM_API_VERSION: make them agree"
    exit 1
  fi
  if fresh ocm "$m/go.mod" "$m/go.sum" <(declare -f build_ocm) \
    && [ -x "$out/registration" ] && [ -x "$out/work" ] && [ -x "$out/placement" ] && [ -x "$out/addon" ] \
    && [ -f "$cache/ocm/bootstrap-clusterrole.yaml" ]; then
    return
  fi
  local v dir
  v=$(awk '$1 == "open-cluster-management.io/ocm" { print $2 }' "$m/go.mod")
  log "building OCM $v: registration, work, placement, addon (about 8 minutes on 2 cores when cold)"
  local t0=$SECONDS
  local pkg=open-cluster-management.io/ocm/pkg/version
  local major minor
  major=$(echo "${v#v}" | cut -d. -f1)
  minor=$(echo "$v" | cut -d. -f2)
  mkdir -p "$out"
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X $pkg.versionFromGit=$v -X $pkg.majorFromGit=$major -X $pkg.minorFromGit=$minor" \
    -o "$out/" open-cluster-management.io/ocm/cmd/registration open-cluster-management.io/ocm/cmd/work \
    open-cluster-management.io/ocm/cmd/placement open-cluster-management.io/ocm/cmd/addon)
  # The bootstrap ClusterRole that OCM's cluster-manager chart gives the
  # identity in a klusterlet's bootstrap kubeconfig (create CSRs and its
  # ManagedCluster); the chart's template lines only switch it on.
  dir=$(cd "$m" && go list -m -f '{{.Dir}}' open-cluster-management.io/ocm)
  mkdir -p "$cache/ocm"
  sed '/^{{/d' "$dir/deploy/cluster-manager/chart/cluster-manager/templates/bootstrap_cluster_role.yaml" \
    > "$cache/ocm/bootstrap-clusterrole.yaml"
  mark ocm "$m/go.mod" "$m/go.sum" <(declare -f build_ocm)
  log "OCM built in $((SECONDS - t0))s"
}

build_clusteradm() {
  local m=$here/clusteradm
  if fresh clusteradm "$m/go.mod" "$m/go.sum" <(declare -f build_clusteradm) && [ -x "$bin/clusteradm" ]; then
    return
  fi
  log "building clusteradm $(awk '$1 == "open-cluster-management.io/clusteradm" { print $2 }' "$m/go.mod") (about 3 minutes on 2 cores when cold)"
  local t0=$SECONDS
  # clusteradm reads its version from the module's build information.
  (cd "$m" && go build -trimpath -ldflags '-s -w' -o "$bin/" open-cluster-management.io/clusteradm/cmd/clusteradm)
  mark clusteradm "$m/go.mod" "$m/go.sum" <(declare -f build_clusteradm)
  log "clusteradm built in $((SECONDS - t0))s"
}

# The Argo CD components the harness runs as processes (testenv::argocd).
# Their release must be the one whose CRDs collect_crds installs.
build_argocd() {
  local m=$here/argocd
  local v
  v=$(awk '$1 == "github.com/argoproj/argo-cd/v3" { print $2 }' "$m/go.mod")
  if [ "$v" != "$ARGOCD_VERSION" ]; then
    log "test/tools/argocd/go.mod uses github.com/argoproj/argo-cd/v3 $v but versions.env installs the CRDs of $ARGOCD_VERSION: make them agree"
    exit 1
  fi
  if fresh argocd "$m/go.mod" "$m/go.sum" "$m/main.go" <(declare -f build_argocd) \
    && [ -x "$bin/argocd" ] && [ -x "$bin/git-verify-wrapper.sh" ]; then
    return
  fi
  log "building Argo CD $v: application-controller, repo-server, applicationset-controller (about 8 minutes on 2 cores when cold)"
  local t0=$SECONDS
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X github.com/argoproj/argo-cd/v3/common.version=${v#v}" \
    -o "$bin/argocd" .)
  # The repo-server runs this script of Argo CD's image (from PATH) on every
  # revision it renders, signed or not, GnuPG on or off.
  local dir
  dir=$(cd "$m" && go list -m -f '{{.Dir}}' github.com/argoproj/argo-cd/v3)
  install -m 0755 "$dir/hack/git-verify-wrapper.sh" "$bin/git-verify-wrapper.sh"
  mark argocd "$m/go.mod" "$m/go.sum" "$m/main.go" <(declare -f build_argocd)
  log "Argo CD built in $((SECONDS - t0))s"
}

# fetch_debs DIR PACKAGE...: Debian's packages downloaded (not installed)
# and unpacked into DIR, which is made anew.
fetch_debs() {
  local out=$1 dl=$1-debs; shift
  rm -rf "$out" "$dl" && mkdir -p "$out" "$dl"
  # As root, apt downloads as its _apt user, which cannot write here.
  local opts=()
  [ "$(id -u)" = 0 ] && opts=(-o APT::Sandbox::User=root)
  if ! (cd "$dl" && apt-get -q "${opts[@]}" download "$@" >/dev/null); then
    # A fresh machine may have no package lists yet; only root can fetch them.
    [ "$(id -u)" = 0 ] || { log "$*: apt-get download failed; run 'apt-get update' as root first"; exit 1; }
    apt-get -q update >/dev/null
    (cd "$dl" && apt-get -q "${opts[@]}" download "$@" >/dev/null)
  fi
  local deb
  for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$out"; done
  rm -rf "$dl"
}

# Redis for Argo CD's caches, from the system's (Debian) packages, unpacked
# into the cache rather than installed: no root needed, nothing left on the
# machine. The server binary is in redis-tools (redis-server's package only
# adds a symlink to it, configuration and init scripts). Those of its
# libraries the machine lacks are unpacked next to it, and $bin/redis-server
# points the dynamic loader at them.
build_redis() {
  local out=$cache/redis
  if fresh redis <(declare -f build_redis fetch_debs) && "$bin/redis-server" --version >/dev/null 2>&1; then
    return
  fi
  command -v apt-get >/dev/null || { log "redis: apt-get is needed to fetch Debian's redis-tools"; exit 1; }
  local t0=$SECONDS pkgs=(redis-tools) dep
  for dep in $(apt-cache depends redis-tools 2>/dev/null \
    | awk '$1 ~ /Depends:$/ && $2 ~ /^lib/ && $2 != "libc6" { print $2 }'); do
    dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' || pkgs+=("$dep")
  done
  log "fetching ${pkgs[*]} from the system's package sources"
  fetch_debs "$out" "${pkgs[@]}"
  local libs
  libs=$(find "$out" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)
  if LD_LIBRARY_PATH=$libs ldd "$out/usr/bin/redis-check-rdb" | grep 'not found'; then
    log "redis: the libraries above are missing; add their packages to build_redis"
    exit 1
  fi
  # redis-check-rdb is the server: redis picks its role from the name it runs as.
  ln -sf redis-check-rdb "$out/usr/bin/redis-server"
  printf '%s\n' '#!/bin/sh' \
    '# Debian'"'"'s redis-server, unpacked by test/tools/build.sh.' \
    "LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $out/usr/bin/redis-server \"\$@\"" \
    > "$bin/redis-server"
  chmod +x "$bin/redis-server"
  mark redis <(declare -f build_redis fetch_debs)
  log "$("$bin/redis-server" --version | cut -d' ' -f1-3) ready in $((SECONDS - t0))s"
}

# runc, the OCI runtime that runs argocd-pull's images in the tests, from
# the system's (Debian) package, unpacked into the cache like Redis. Its
# only library beyond libc is libseccomp, which apt itself needs.
build_runc() {
  local out=$cache/runc
  if fresh runc <(declare -f build_runc fetch_debs) && "$bin/runc" --version >/dev/null 2>&1; then
    return
  fi
  command -v apt-get >/dev/null || { log "runc: apt-get is needed to fetch Debian's runc"; exit 1; }
  local t0=$SECONDS
  fetch_debs "$out" runc
  if ldd "$out/usr/sbin/runc" | grep 'not found'; then
    log "runc: the libraries above are missing (apt-get install libseccomp2)"
    exit 1
  fi
  ln -sf "$out/usr/sbin/runc" "$bin/runc"
  mark runc <(declare -f build_runc fetch_debs)
  log "$("$bin/runc" --version | head -1) ready in $((SECONDS - t0))s"
}

# tinyproxy, the HTTP CONNECT proxy the agent reaches the hub through in
# the proxy tests (Basic authentication, an idle Timeout), from Debian's
# tinyproxy-bin, which needs nothing beyond libc.
build_tinyproxy() {
  local out=$cache/tinyproxy
  if fresh tinyproxy <(declare -f build_tinyproxy fetch_debs) && "$bin/tinyproxy" -v >/dev/null 2>&1; then
    return
  fi
  command -v apt-get >/dev/null || { log "tinyproxy: apt-get is needed to fetch Debian's tinyproxy-bin"; exit 1; }
  local t0=$SECONDS
  fetch_debs "$out" tinyproxy-bin
  if ldd "$out/usr/bin/tinyproxy" | grep 'not found'; then
    log "tinyproxy: the libraries above are missing"
    exit 1
  fi
  ln -sf "$out/usr/bin/tinyproxy" "$bin/tinyproxy"
  mark tinyproxy <(declare -f build_tinyproxy fetch_debs)
  log "$("$bin/tinyproxy" -v) ready in $((SECONDS - t0))s"
}

# nginx, the HTTP/1.1-only reverse proxy the WebSocket wire is tested
# through (hub-controller/tests/grpc_websocket.rs), from Debian's
# nginx (bookworm's nginx-light is a transitional package that only
# depends on it), with whatever libraries of its the machine lacks unpacked
# beside it. The wrapper points the loader at them and starts nginx with
# its error log on stderr: the compiled-in path (/var/log/nginx) is not
# writable by the tests.
build_nginx() {
  local out=$cache/nginx
  if fresh nginx <(declare -f build_nginx fetch_debs) && "$bin/nginx" -v >/dev/null 2>&1; then
    return
  fi
  command -v apt-get >/dev/null || { log "nginx: apt-get is needed to fetch Debian's nginx"; exit 1; }
  local t0=$SECONDS
  fetch_debs "$out" nginx
  local missing
  missing=$(ldd "$out/usr/sbin/nginx" | awk '/not found/ { print $1 }')
  if [ -n "$missing" ]; then
    local more=() lib
    for lib in $missing; do
      case $lib in
        libpcre2-8.so.*) more+=(libpcre2-8-0) ;;
        libssl.so.*|libcrypto.so.*) more+=(libssl3) ;;
        libz.so.*) more+=(zlib1g) ;;
        libcrypt.so.*) more+=(libcrypt1) ;;
        *) log "nginx: $lib is missing and no package for it is known here"; exit 1 ;;
      esac
    done
    fetch_debs "$out.libs" $(printf '%s\n' "${more[@]}" | sort -u)
    cp -a "$out.libs"/. "$out"/ && rm -rf "$out.libs"
  fi
  local libs="$out/usr/lib/x86_64-linux-gnu:$out/lib/x86_64-linux-gnu"
  if LD_LIBRARY_PATH=$libs ldd "$out/usr/sbin/nginx" | grep 'not found'; then
    log "nginx: the libraries above are missing"
    exit 1
  fi
  cat >"$bin/nginx" <<WRAPPER
#!/bin/sh
LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec "$out/usr/sbin/nginx" -e stderr "\$@"
WRAPPER
  chmod +x "$bin/nginx"
  mark nginx <(declare -f build_nginx fetch_debs)
  log "$("$bin/nginx" -v 2>&1) ready in $((SECONDS - t0))s"
}

# iptables, which the nodes' network namespaces need (Service addresses,
# kubernetes.default, the CNI bridge's masquerading), from Debian's package
# and the one library it needs that a minimal system may lack, unpacked
# into the cache: wrappers in $bin run its legacy (x_tables) backend, the
# one every kernel with ip_tables has, whatever the system's iptables is
# (or whether it has one).
build_iptables() {
  local out=$cache/iptables
  if fresh iptables <(declare -f build_iptables fetch_debs) && "$bin/iptables" --version >/dev/null 2>&1; then
    return
  fi
  command -v apt-get >/dev/null || { log "iptables: apt-get is needed to fetch Debian's iptables"; exit 1; }
  local t0=$SECONDS
  fetch_debs "$out" iptables libip6tc2
  local libs multi=$out/usr/sbin/xtables-legacy-multi
  libs=$(dirname "$(find "$out" -name 'libip6tc.so.2*' | head -1)")
  if LD_LIBRARY_PATH=$libs ldd "$multi" | grep 'not found'; then
    log "iptables: the libraries above are missing (apt-get install iptables)"
    exit 1
  fi
  # xtables-legacy-multi is every command at once; it picks one by its name.
  for cmd in iptables iptables-restore iptables-save ip6tables ip6tables-restore ip6tables-save; do
    printf '%s\n' '#!/bin/bash' \
      '# Debian'"'"'s iptables (legacy backend), unpacked by test/tools/build.sh.' \
      "XTABLES_LIBDIR=$libs/xtables LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec -a $cmd $multi \"\$@\"" \
      > "$bin/$cmd"
    chmod +x "$bin/$cmd"
  done
  # The matches and targets (tcp, DNAT, statistic) are modules of its own.
  "$bin/iptables" -p tcp --dport 1 -m statistic --mode random --probability 0.5 -j DNAT -h >/dev/null \
    || { log "iptables: $bin/iptables does not run or lacks its extensions"; exit 1; }
  mark iptables <(declare -f build_iptables fetch_debs)
  log "$("$bin/iptables" --version) ready in $((SECONDS - t0))s"
}

# Helm, to lint and render the chart (deploy/helm/argocd-pull) in the tests.
build_helm() {
  local m=$here/helm
  if fresh helm "$m/go.mod" "$m/go.sum" <(declare -f build_helm) && [ -x "$bin/helm" ]; then
    return
  fi
  local v
  v=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$m/go.mod")
  log "building helm $v (about 2 minutes on 2 cores when cold)"
  local t0=$SECONDS
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$v" \
    -o "$bin/helm" helm.sh/helm/v4/cmd/helm)
  mark helm "$m/go.mod" "$m/go.sum" <(declare -f build_helm)
  log "helm built in $((SECONDS - t0))s"
}

# What a real node of the harness runs: the kubelet and kube-scheduler from
# the same Kubernetes release as the API server (kube/go.mod), containerd
# with its runc shim and ctr, and the CNI plugins (node/go.mod). runc
# itself is Debian's (build_runc).
build_node() {
  local k=$here/kube m=$here/node out=$bin/node
  if fresh node "$k/go.mod" "$k/go.sum" "$m/go.mod" "$m/go.sum" "$m/pause.c" <(declare -f build_node) \
    && [ -x "$bin/kubelet" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$out/containerd" ] \
    && [ -x "$out/containerd-shim-runc-v2" ] && [ -x "$out/ctr" ] && [ -x "$out/cni/bridge" ] && [ -x "$out/pause" ]; then
    return
  fi
  local v minor cv
  v=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$k/go.mod")
  minor=$(echo "$v" | cut -d. -f2)
  cv=$(awk '$1 == "github.com/containerd/containerd/v2" { print $2 }' "$m/go.mod")
  log "building kubelet and kube-scheduler $v, containerd $cv and the CNI plugins (about 5 minutes on 2 cores after Kubernetes)"
  local t0=$SECONDS
  local pkg=k8s.io/component-base/version
  (cd "$k" && go build -trimpath \
    -ldflags "-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
    -o "$bin/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler)
  mkdir -p "$out/cni"
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$cv" \
    -o "$out/" github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr)
  (cd "$m" && go build -trimpath -ldflags "-s -w" -o "$out/cni/" \
    github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap)
  # The sandbox ("pause") program, static: no registry serves Kubernetes' own.
  gcc -static -Os -o "$out/pause" "$m/pause.c"
  mark node "$k/go.mod" "$k/go.sum" "$m/go.mod" "$m/go.sum" "$m/pause.c" <(declare -f build_node)
  log "node components built in $((SECONDS - t0))s"
}

# The harness's pod that writes a line a second (node/ticker.c, image
# argocd-pull-ticker): what the hub's Argo CD shows as a pod's logs.
build_ticker() {
  local m=$here/node out=$bin/node
  if fresh ticker "$m/ticker.c" <(declare -f build_ticker) && [ -x "$out/ticker" ]; then return; fi
  mkdir -p "$out"
  gcc -static -Os -o "$out/ticker" "$m/ticker.c"
  mark ticker "$m/ticker.c" <(declare -f build_ticker)
  log "ticker built"
}

# The previous release's hub-controller and spoke-agent (versions.env), built
# from this repository's own history in a copy under the cache: the upgrade
# test runs them next to this build's binaries.
build_previous() {
  local c=$PREVIOUS_RELEASE_COMMIT out=$cache/previous
  if fresh previous <(echo "$c") <(declare -f build_previous) \
    && [ -x "$out/bin/hub-controller" ] && [ -x "$out/bin/spoke-agent" ]; then
    return
  fi
  if ! git -C "$root" cat-file -e "$c^{commit}" 2>/dev/null; then
    log "the previous release $PREVIOUS_RELEASE (commit $c) is not in this checkout's history:"
    log "fetch it (git fetch --unshallow, or git fetch origin $c) and run again"
    exit 1
  fi
  log "building the previous release $PREVIOUS_RELEASE ($c): hub-controller and spoke-agent (about 2 minutes cold on 2 cores)"
  local t0=$SECONDS
  rm -rf "$out/src" "$out/bin"
  mkdir -p "$out/src" "$out/bin"
  git -C "$root" archive "$c" | tar -x -C "$out/src"
  (cd "$out/src" && CARGO_TARGET_DIR=$out/target cargo build --locked --bin hub-controller --bin spoke-agent)
  cp "$out/target/debug/hub-controller" "$out/target/debug/spoke-agent" "$out/bin/"
  rm -rf "$out/src"
  mark previous <(echo "$c") <(declare -f build_previous)
  log "previous release built in $((SECONDS - t0))s"
}

# The hub's Argo CD API server and the `argocd` CLI (test/tools/argocd-server,
# one multi-call binary): $bin/argocd-server, and $bin/argocd-cli/argocd
# linked to it (a folder of its own: $bin/argocd is the controllers' binary,
# which the repo-server finds on PATH as its askpass helper).
build_argocd_server() {
  local m=$here/argocd-server
  local v
  v=$(awk '$1 == "github.com/argoproj/argo-cd/v3" { print $2 }' "$m/go.mod")
  if [ "$v" != "$ARGOCD_VERSION" ]; then
    log "test/tools/argocd-server/go.mod uses github.com/argoproj/argo-cd/v3 $v but versions.env installs the CRDs of $ARGOCD_VERSION: make them agree"
    exit 1
  fi
  if ! diff <(cd "$here/argocd" && go mod edit -json | jq -c .Replace) <(cd "$m" && go mod edit -json | jq -c .Replace) >/dev/null; then
    log "test/tools/argocd-server/go.mod's replace lines differ from test/tools/argocd/go.mod's: make them agree"
    exit 1
  fi
  # The UI is embedded (main.go says why): built first, part of the stamp.
  build_argocd_ui
  if fresh argocd-server "$m/go.mod" "$m/go.sum" "$m/main.go" "$cache/stamps/argocd-ui" <(declare -f build_argocd_server) \
    && [ -x "$bin/argocd-server" ] && [ -L "$bin/argocd-cli/argocd" ]; then
    return
  fi
  log "building Argo CD $v: argocd-server with the UI, and the argocd CLI (about 4 minutes on 2 cores after the controllers)"
  local t0=$SECONDS
  rm -rf "$m/dist" && mkdir -p "$m/dist" && cp -r "$cache/argocd-ui" "$m/dist/app"
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X github.com/argoproj/argo-cd/v3/common.version=${v#v}" \
    -o "$bin/argocd-server" .)
  mkdir -p "$bin/argocd-cli"
  ln -sfn ../argocd-server "$bin/argocd-cli/argocd"
  rm -rf "$m/dist"
  mark argocd-server "$m/go.mod" "$m/go.sum" "$m/main.go" "$cache/stamps/argocd-ui" <(declare -f build_argocd_server)
  log "argocd-server built in $((SECONDS - t0))s"
}

# Where tarballs of git commits are kept between builds and checkouts: the
# user's cache, so that a fresh clone of this repository finds what an
# earlier one obtained.
tarball_cache() { echo "${XDG_CACHE_HOME:-$HOME/.cache}/argocd-pull/tarballs"; }

# git_tarball OWNER REPO COMMIT URL DEST: a tarball of github.com/OWNER/REPO
# at COMMIT (its files under package/) into DEST, from the first of: the
# tarball cache; a git clone holding the commit under a folder of
# $ARGOCD_PULL_GIT_MIRRORS (`:`-separated; each holds OWNER/REPO or
# OWNER+REPO/repo); URL, only when ARGOCD_PULL_FETCH_GITHUB=1 (a machine
# that reaches only the package registries does not try it). What a clone
# or URL gave is kept in the cache.
git_tarball() {
  local owner=$1 repo=$2 commit=$3 url=$4 dest=$5 kept dir mirrors
  kept=$(tarball_cache)/$owner+$repo-$commit.tgz
  if [ -s "$kept" ]; then
    cp "$kept" "$dest"
    log "argocd-ui: $owner/$repo $commit from $kept"
    return 0
  fi
  IFS=: read -ra mirrors <<<"${ARGOCD_PULL_GIT_MIRRORS:-}"
  for dir in "${mirrors[@]}"; do
    [ -n "$dir" ] || continue
    for dir in "$dir/$owner/$repo" "$dir/$owner+$repo/repo"; do
      if git -C "$dir" cat-file -e "$commit^{commit}" 2>/dev/null; then
        git -C "$dir" archive --format=tar --prefix=package/ "$commit" | gzip -n >"$dest"
        log "argocd-ui: $owner/$repo $commit from the clone $dir"
        mkdir -p "$(dirname "$kept")" && cp "$dest" "$kept"
        return 0
      fi
    done
  done
  if [ "${ARGOCD_PULL_FETCH_GITHUB:-}" = 1 ] && curl -fsSL --retry 2 --max-time 120 -o "$dest" "$url" 2>/dev/null; then
    log "argocd-ui: $owner/$repo $commit from $url"
    mkdir -p "$(dirname "$kept")" && cp "$dest" "$kept"
    return 0
  fi
  return 1
}

# Argo CD's web UI, which the argocd-server binary embeds: built
# from the ui/ folder of the pinned argo-cd module (its module download
# ships the sources with an empty dist/app) into $cache/argocd-ui, with its
# locked npm dependencies from the npm registry (pnpm, the release its
# package.json names, run by npx) and upstream's webpack configuration.
#
# One dependency is no npm package: the lock takes argo-ui as a tarball of a
# GitHub commit, and no package registry serves that commit (the npm
# registry's `argo-ui` 1.0.0 is an older code base: React 16 where the pin
# needs 19, without the components Argo CD's UI imports). See
# git_tarball for where it is looked for. Without it the UI is not built:
# argocd-server serves a page saying so, $cache/argocd-ui/NOT-BUILT says
# why, and the tests that drive the UI in a browser say that they did not
# (test/tools/run-tests.sh lists them at the end); everything else is
# built and tested as usual.
build_argocd_ui() {
  local out=$cache/argocd-ui
  if fresh argocd-ui <(echo "$ARGOCD_VERSION") <(declare -f build_argocd_ui git_tarball) \
    && [ -f "$out/index.html" ] && [ ! -f "$out/NOT-BUILT" ]; then
    return
  fi
  command -v node >/dev/null && command -v npx >/dev/null \
    || { log "argocd-ui: node and npx are needed (Debian: apt-get install nodejs npm)"; exit 1; }
  local src work=$cache/argocd-ui-build t0=$SECONDS
  src=$(module_dir "github.com/argoproj/argo-cd/v3@$ARGOCD_VERSION")/ui
  [ -f "$src/pnpm-lock.yaml" ] || { log "argocd-ui: $src has no pnpm-lock.yaml"; exit 1; }
  local pnpm
  pnpm=$(jq -r '.packageManager // empty' "$src/package.json")
  case $pnpm in pnpm@*) ;; *) log "argocd-ui: $src/package.json names no pnpm release ($pnpm)"; exit 1 ;; esac
  rm -rf "$work" && mkdir -p "$work/deps"
  cp -r "$src/." "$work/ui" && chmod -R u+w "$work/ui"
  local url owner repo commit tgz
  for url in $(sed -n 's|.*resolution: {tarball: \(https://codeload\.github\.com/[^}]*\)}.*|\1|p' "$src/pnpm-lock.yaml" | sort -u); do
    IFS=/ read -r owner repo commit <<<"${url#https://codeload.github.com/}"
    commit=${commit#tar.gz/}
    tgz=$work/deps/$repo-$commit.tgz
    if ! git_tarball "$owner" "$repo" "$commit" "$url" "$tgz"; then
      local why="the lock takes $owner/$repo at $commit from $url, which no package registry serves, and no clone or kept tarball of it is on this machine"
      log "WARNING: Argo CD's UI is not built: $why."
      log "  argocd-server and every test but the browser's are built as usual. To build the UI, put a git clone of"
      log "  https://github.com/$owner/$repo under a folder named by ARGOCD_PULL_GIT_MIRRORS (as <folder>/$owner/$repo),"
      log "  or its tarball at $(tarball_cache)/$owner+$repo-$commit.tgz, or set ARGOCD_PULL_FETCH_GITHUB=1 where GitHub"
      log "  is reachable, and run make tools again."
      rm -rf "$out" "$work" && mkdir -p "$out"
      echo "$why" >"$out/NOT-BUILT"
      printf '<!doctype html><title>Argo CD</title><p>Argo CD'"'"'s UI was not built on this machine: %s (docs/testing.md).</p>\n' "$why" >"$out/index.html"
      echo "not built: $why" >"$cache/stamps/argocd-ui"
      return
    fi
    local spec="git+https://github.com/$owner/$repo.git#$commit"
    grep -q "\"$spec\"" "$work/ui/package.json" \
      || { log "argocd-ui: package.json does not take $spec as the lock does"; exit 1; }
    sed -i "s|\"$spec\"|\"file:../deps/$repo-$commit.tgz\"|" "$work/ui/package.json"
  done
  log "building Argo CD $ARGOCD_VERSION's UI with $pnpm and webpack (about 6 minutes on 2 cores when cold)"
  # Not --frozen-lockfile: the specifiers changed above are re-resolved to
  # the local tarballs; pnpm keeps every other locked resolution.
  (cd "$work/ui" && npx -y "$pnpm" install --no-frozen-lockfile --reporter=append-only \
    --store-dir "$work/store" >"$work/install.log" 2>&1) \
    || { tail -30 "$work/install.log" >&2; log "argocd-ui: pnpm install failed; its log: $work/install.log"; exit 1; }
  log "argocd-ui: dependencies installed after $((SECONDS - t0))s"
  # As upstream's image builds it (its Dockerfile's `pnpm run build`).
  (cd "$work/ui" && NODE_ENV=production NODE_ONLINE_ENV=online ARGO_VERSION="$ARGOCD_VERSION" \
    NODE_OPTIONS=--max-old-space-size=8192 \
    node_modules/.bin/webpack --config ./src/app/webpack.config.js --mode production >"$work/build.log" 2>&1) \
    || { tail -30 "$work/build.log" >&2; log "argocd-ui: webpack failed; its log: $work/build.log"; exit 1; }
  [ -f "$work/ui/dist/app/index.html" ] || { log "argocd-ui: webpack wrote no dist/app/index.html"; exit 1; }
  rm -rf "$out" && mv "$work/ui/dist/app" "$out"
  # The source maps are a third of the size and of no use to a test.
  find "$out" -name '*.map' -delete
  rm -rf "$work"
  mark argocd-ui <(echo "$ARGOCD_VERSION") <(declare -f build_argocd_ui git_tarball)
  log "Argo CD's UI built in $((SECONDS - t0))s into $out"
}

# Debian's chromium, for the test that drives Argo CD's UI in a headless
# browser (test/src/browser.rs). A system package: Chromium needs too many
# libraries to unpack beside it as build_redis does. Installed only as root;
# anyone else is told the command.
build_chromium() {
  if command -v chromium >/dev/null; then return; fi
  if [ "$(id -u)" != 0 ]; then
    log "chromium: run 'sudo apt-get install -y chromium' (the browser test needs it)"
    exit 1
  fi
  log "installing Debian's chromium (apt-get install -y chromium)"
  local t0=$SECONDS
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; then
    apt-get -q update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
  fi
  log "$(chromium --version) installed in $((SECONDS - t0))s"
}

# promtool, to unit-test the chart's alert rules (`promtool test rules` on
# the PrometheusRule that deploy/helm/argocd-pull renders).
build_promtool() {
  local m=$here/promtool
  if fresh promtool "$m/go.mod" "$m/go.sum" <(declare -f build_promtool) && [ -x "$bin/promtool" ]; then
    return
  fi
  local v
  v=$(awk '$1 == "github.com/prometheus/prometheus" { print $2 }' "$m/go.mod")
  log "building promtool from github.com/prometheus/prometheus $v (about 4 minutes on 2 cores when cold)"
  local t0=$SECONDS
  (cd "$m" && go build -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$v" \
    -o "$bin/promtool" github.com/prometheus/prometheus/cmd/promtool)
  mark promtool "$m/go.mod" "$m/go.sum" <(declare -f build_promtool)
  log "promtool built in $((SECONDS - t0))s"
}

# The oracle of the AppProject rule test (core/tests/project_rule.rs):
# Argo CD's own project functions, from the release build_argocd builds.
build_projectrule() {
  local m=$here/projectrule
  local v
  v=$(awk '$1 == "github.com/argoproj/argo-cd/v3" { print $2 }' "$m/go.mod")
  if [ "$v" != "$ARGOCD_VERSION" ]; then
    log "test/tools/projectrule/go.mod uses github.com/argoproj/argo-cd/v3 $v but versions.env installs $ARGOCD_VERSION: make them agree"
    exit 1
  fi
  if fresh projectrule "$m/go.mod" "$m/go.sum" "$m/main.go" <(declare -f build_projectrule) \
    && [ -x "$bin/projectrule" ]; then
    return
  fi
  log "building the AppProject rule oracle from Argo CD $v (about 3 minutes on 2 cores when cold)"
  local t0=$SECONDS
  (cd "$m" && go build -trimpath -ldflags '-s -w' -o "$bin/projectrule" .)
  mark projectrule "$m/go.mod" "$m/go.sum" "$m/main.go" <(declare -f build_projectrule)
  log "projectrule built in $((SECONDS - t0))s"
}

# `build.sh PART...` builds only those parts (e.g. `build.sh helm runc`).
if [ $# -gt 0 ]; then
  for part in "$@"; do "build_$part"; done
  exit 0
fi

check_disk
build_etcd
build_kube
collect_crds
build_ocm
build_clusteradm
build_argocd
build_projectrule
build_redis
build_runc
build_tinyproxy
build_nginx
build_iptables
build_helm
build_node
build_ticker
build_previous
build_argocd_server
build_chromium
build_promtool
log "ready: $bin"
