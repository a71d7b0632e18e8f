#!/usr/bin/env bash
# `make demo`: for now, a local hub and two managed clusters (started by
# `make clusters`) and how to reach them. The pull model itself is wired in
# as the transports land.
set -euo pipefail
dir=${1:?clusters folder}
kubectl=$(cd "$(dirname "$0")/.." && pwd)/.cache/bin/kubectl
echo
echo "== argocd-pull demo: local clusters"
for c in hub cluster1 cluster2; do
  kc=$dir/$c/kubeconfig
  printf '%-9s %s\n' "$c" "$("$kubectl" --kubeconfig "$kc" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/kube-apiserver \1/p' | tail -1)"
done
echo
echo "CRDs on the hub:"
"$kubectl" --kubeconfig "$dir/hub/kubeconfig" get crd -o name | sed 's/^/  /'
cat <<TXT

Try:
  $kubectl --kubeconfig $dir/hub/kubeconfig get managedclusters,manifestworks -A
  $kubectl --kubeconfig $dir/cluster1/kubeconfig get applications -A

Stop everything with: make demo-down
TXT
