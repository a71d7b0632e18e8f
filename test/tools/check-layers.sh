#!/usr/bin/env bash
# The crate graph is the architecture: this fails `make lint` when a crate
# depends on something its layer forbids. Read from `cargo metadata` (the
# dependencies each crate declares, with the features it asks for), so a
# new arrow is caught when it is written, not when someone notices.
#
# The layers, bottom up (docs/architecture.md, "Crates and layers"):
#   model      apis, core        pure types and transforms: no I/O, no
#                                client, no runtime, no wire
#   wire       proto             the gRPC contract: tonic and prost, no
#                                Kubernetes client
#   runtime    runtime           process plumbing (admin server, logs,
#                                metrics, shutdown): no product crate
#   product    hub-controller, spoke-agent, addon, kubectl plugin: any
#              layer below, never each other (but the addon's rendering,
#              which the hub-controller serves and the plugin reads)
#   harness    test, bench       anything, and nothing product depends on
set -euo pipefail
cd "$(dirname "$0")/../.."

# crate <TAB> workspace crates it may depend on (space-separated, "-" none)
allowed_workspace=$(cat <<'EOF'
argocd-pull-apis	-
argocd-pull-core	argocd-pull-apis
argocd-pull-proto	-
argocd-pull-proto-gen	-
argocd-pull-runtime	-
argocd-pull-addon	-
argocd-pull-hub-controller	argocd-pull-apis argocd-pull-core argocd-pull-proto argocd-pull-runtime argocd-pull-addon
argocd-pull-spoke-agent	argocd-pull-apis argocd-pull-core argocd-pull-proto argocd-pull-runtime
argocd-pull-kubectl	argocd-pull-apis argocd-pull-core argocd-pull-addon
argocd-pull-test	argocd-pull-apis
argocd-pull-bench	*
EOF
)

# crate <TAB> third-party crates it must not depend on at all
forbidden_external=$(cat <<'EOF'
argocd-pull-apis	tokio tonic prost hyper hyper-util axum tower reqwest prometheus-client tracing rustls tokio-rustls
argocd-pull-core	tokio tonic prost hyper hyper-util axum tower reqwest prometheus-client tracing rustls tokio-rustls
argocd-pull-proto	kube k8s-openapi axum hyper-util prometheus-client
EOF
)

# crate <TAB> features of `kube` it must not ask for (a client, a runtime)
forbidden_kube_features=$(cat <<'EOF'
argocd-pull-apis	client runtime rustls-tls openssl-tls ws unstable-runtime
argocd-pull-core	client runtime rustls-tls openssl-tls ws unstable-runtime
EOF
)

meta=$(cargo metadata --format-version 1 --locked --no-deps)
members=$(jq -r '.packages[].name' <<<"$meta" | sort)
problems=0
say() { echo "check-layers: $*" >&2; problems=$((problems + 1)); }

for crate in $members; do
  rule=$(awk -F'\t' -v c="$crate" '$1 == c { print $2 }' <<<"$allowed_workspace")
  if [ -z "$rule" ]; then
    say "$crate has no layer: add it to test/tools/check-layers.sh and docs/architecture.md"
    continue
  fi
  [ "$rule" = "*" ] && continue
  # Normal and build dependencies; dev-dependencies (tests) may reach further.
  deps=$(jq -r --arg c "$crate" '.packages[] | select(.name == $c) | .dependencies[]
           | select(.kind == null or .kind == "build") | [.name, (.features | join(","))] | @tsv' <<<"$meta")
  while IFS=$'\t' read -r dep features; do
    [ -n "$dep" ] || continue
    if grep -qx "$dep" <<<"$members"; then
      case " $rule " in *" $dep "*) ;; *) say "$crate depends on $dep, which its layer forbids (it may depend on: $rule)" ;; esac
      continue
    fi
    bad=$(awk -F'\t' -v c="$crate" '$1 == c { print $2 }' <<<"$forbidden_external")
    case " $bad " in *" $dep "*) say "$crate depends on $dep, which its layer forbids (no I/O, client or wire below the product crates)" ;; esac
    if [ "$dep" = kube ]; then
      for f in ${features//,/ }; do
        badf=$(awk -F'\t' -v c="$crate" '$1 == c { print $2 }' <<<"$forbidden_kube_features")
        case " $badf " in *" $f "*) say "$crate asks for kube's '$f' feature: its layer holds types only (kube's 'derive')" ;; esac
      done
    fi
  done <<<"$deps"
done

if [ "$problems" -gt 0 ]; then
  echo "check-layers: $problems problem(s)" >&2
  exit 1
fi
echo "check-layers: $(wc -w <<<"$members") crates keep to their layers"
