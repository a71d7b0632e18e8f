// Builds upstream's pull controller (open-cluster-management.io/argocd-pull-integration)
// for `make bench-manifestwork`. test/tools/build-upstream.sh copies this file
// into the cache, pins the version from versions.env and builds there, so the
// checksums the Go toolchain verifies never need to be checked in here.
module argocd-pull.local/tools/upstream

go 1.26.0
