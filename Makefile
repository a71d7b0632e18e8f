# argocd-pull: every set-up step a fresh machine needs is reachable from here.
#   make test   builds what it needs and runs every test
#   make demo   brings up a local hub and managed clusters
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
CACHE ?= $(CURDIR)/.cache
CLUSTERS_DIR ?= $(CACHE)/clusters
TESTENV := $(CURDIR)/target/debug/testenv
export ARGOCD_PULL_CACHE := $(CACHE)

.PHONY: all tools build lint fmt generate check-generated test test-unit clusters clusters-down demo demo-down demo-status clean

all: build

## tools: build etcd, kube-apiserver, kube-controller-manager, kubectl from upstream, collect CRDs (cached)
tools:
	@bash test/tools/build.sh

build:
	$(CARGO) build --workspace --all-targets

fmt:
	$(CARGO) fmt --all

## lint: formatting, the crates' layers (test/tools/check-layers.sh), the hub-controller's module layers and import circles (test/tools/check-modules.sh), clippy and rustdoc with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	@for f in test/tools/*.sh; do bash -n "$$f" || exit 1; done
	@bash test/tools/check-layers.sh
	@bash test/tools/check-modules.sh hub-controller
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --locked

## generate: regenerate the OCM types from the pinned upstream CRDs, the wire contract's Rust from proto/, and deploy/hub from the Helm chart
generate: tools
	@bash apis/generate.sh
	@bash proto/generate.sh
	@bash deploy/generate.sh

## check-generated: fail when checked-in generated code drifts from its source (and helm lint the chart)
check-generated: tools
	@bash apis/generate.sh --check
	@bash proto/generate.sh --check
	@bash deploy/generate.sh --check

## images: the hub-controller and spoke-agent images as OCI archives in target/images/
## (no container engine or registry needed; PROFILE=release|dev, ARCH=amd64|arm64, IMAGES_OUT=dir; docs/install.md)
PROFILE ?= release
ARCH ?= amd64
IMAGES_OUT ?= $(CURDIR)/target/images
IMAGE_TRIPLE := $(if $(filter arm64,$(ARCH)),aarch64-unknown-linux-gnu,)
IMAGE_BIN_DIR := $(CURDIR)/target/$(if $(IMAGE_TRIPLE),$(IMAGE_TRIPLE)/,)$(if $(filter dev,$(PROFILE)),debug,$(PROFILE))
.PHONY: images
images:
	$(if $(IMAGE_TRIPLE),CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc,) $(CARGO) build --locked --profile $(PROFILE) $(if $(IMAGE_TRIPLE),--target $(IMAGE_TRIPLE),) \
	  -p argocd-pull-hub-controller -p argocd-pull-spoke-agent --bins
	@bash deploy/images/build.sh --profile $(PROFILE) --arch $(ARCH) --bin-dir $(IMAGE_BIN_DIR) --out $(IMAGES_OUT)

## install-plugin: `kubectl argocd-pull` (kubectl-argocd-pull) into $(PREFIX)/bin (docs/operations.md)
PREFIX ?= /usr/local
.PHONY: install-plugin
install-plugin:
	$(CARGO) install --locked --path plugin --root $(PREFIX)

## test: everything (unit, real-API-server integration, lint, drift checks); the test binaries two at a time, those that run real nodes alone (ARGOCD_PULL_TEST_JOBS=N sets how many) and a timing table at the end (docs/testing.md)
test: tools
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint check-generated; \
	bash test/tools/run-tests.sh; \
	echo "make test: $$(( $$(date +%s) - start ))s (after tools)"

test-unit:
	$(CARGO) test --workspace --lib --bins --locked

## clusters: start a hub and two managed clusters in the background; kubeconfigs in $(CLUSTERS_DIR)
clusters: tools
	@$(CARGO) build -q -p argocd-pull-test --bin testenv
	@if [ -f $(CLUSTERS_DIR)/ready ]; then cat $(CLUSTERS_DIR)/ready; exit 0; fi; \
	mkdir -p $(CLUSTERS_DIR); \
	nohup $(TESTENV) --dir $(CLUSTERS_DIR) up > $(CLUSTERS_DIR)/testenv.log 2>&1 & \
	for i in $$(seq 1 300); do \
	  [ -f $(CLUSTERS_DIR)/ready ] && break; \
	  kill -0 $$! 2>/dev/null || { cat $(CLUSTERS_DIR)/testenv.log; exit 1; }; \
	  sleep 0.5; \
	done; \
	cat $(CLUSTERS_DIR)/ready; \
	echo "Stop them with: make clusters-down"

clusters-down:
	@$(CARGO) build -q -p argocd-pull-test --bin testenv
	@$(TESTENV) --dir $(CLUSTERS_DIR) down

## demo: the pull model end to end on this machine (hub + 2 clusters, OCM, Argo CD, argocd-pull, example/)
DEMO_DIR ?= $(CACHE)/demo
demo: tools
	@$(CARGO) build -q --locked -p argocd-pull-test -p argocd-pull-hub-controller -p argocd-pull-spoke-agent -p argocd-pull-kubectl --bins
	@bash test/demo.sh $(DEMO_DIR)

## demo-status: the demo's status table again
demo-status:
	@$(CARGO) build -q -p argocd-pull-test --bin testenv
	@$(TESTENV) --dir $(DEMO_DIR) status

## demo-down: stop the demo and remove its data
demo-down:
	@$(CARGO) build -q -p argocd-pull-test --bin testenv
	@$(TESTENV) --dir $(DEMO_DIR) down

## bench-manifestwork: our hub-controller next to upstream's Go controller on one real hub (docs/benchmarks.md)
.PHONY: bench-manifestwork
BENCH_ARGS ?= --apps 1000,5000 --clusters 50 --impl ours,upstream --repeat 4
bench-manifestwork: tools
	@bash test/tools/build-upstream.sh || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; \
	  echo "bench-manifestwork: upstream's controller is not available (set UPSTREAM_SRC, docs/benchmarks.md); the table will say so"; }
	$(CARGO) build --release --locked -p argocd-pull-hub-controller -p argocd-pull-bench \
	  --bin hub-controller --bin bench-manifestwork
	$(CURDIR)/target/release/bench-manifestwork $(BENCH_ARGS)

## bench-grpc: gRPC transport latency (p50/p99 over 1,000 changes each way), one agent's throughput, and the fleet (bench-grpc-fleet), real API servers, each BENCH_GRPC_REPEAT times (docs/benchmarks.md)
.PHONY: bench-grpc bench-grpc-fleet bench-grpc-build
BENCH_GRPC_ARGS ?= --changes 1000 --apps 100 --updates 20000
BENCH_GRPC_FLEET_ARGS ?= --agents 1000 --apps-per-agent 10
BENCH_GRPC_REPEAT ?= 4
BENCH_GRPC = $(CURDIR)/target/release/bench-grpc --hub-controller $(CURDIR)/target/release/hub-controller --repeat $(BENCH_GRPC_REPEAT)
BENCH_GRPC_COMPARE_ARGS ?= --changes 1000 --apps 100 --updates 5000
bench-grpc: bench-grpc-build
	$(BENCH_GRPC) latency $(BENCH_GRPC_ARGS)
	$(BENCH_GRPC) compare $(BENCH_GRPC_COMPARE_ARGS)
	$(BENCH_GRPC) fleet $(BENCH_GRPC_FLEET_ARGS)
	$(BENCH_GRPC) abuse $(BENCH_ABUSE_ARGS)

## bench-grpc-compare: only ours next to argocd-agent (principal + one managed agent, mTLS) on the same API servers
.PHONY: bench-grpc-compare
bench-grpc-compare: bench-grpc-build
	$(BENCH_GRPC) compare $(BENCH_GRPC_COMPARE_ARGS)

## bench-grpc-fleet: only the fleet: 1,000 simulated agents (one load generator) x 10 Applications on one hub; peak RSS, reconnect and resync after restarts
bench-grpc-fleet: bench-grpc-build
	$(BENCH_GRPC) fleet $(BENCH_GRPC_FLEET_ARGS)

## bench-grpc-conn-cost: what one more connected agent costs the hub: the fleet's first start and steady state at 2,000 and 4,000 agents x 1 Application, the slope of the hub's RSS between them (docs/benchmarks.md)
.PHONY: bench-grpc-conn-cost
BENCH_GRPC_CONN_COST_ARGS ?= --agents 2000 --more-agents 4000 --apps-per-agent 1 --steady-secs 31
bench-grpc-conn-cost: bench-grpc-build
	$(BENCH_GRPC) conn-cost $(BENCH_GRPC_CONN_COST_ARGS)

## bench-grpc-fleet-live: the fleet with the hub's live views on: every cluster read once through the live endpoint (discovery and an object), the hub's memory before and after (docs/benchmarks.md)
.PHONY: bench-grpc-fleet-live
bench-grpc-fleet-live: bench-grpc-build
	$(BENCH_GRPC) fleet $(BENCH_GRPC_FLEET_ARGS) --live

## bench-grpc-fleet-compare: the fleet next to argocd-agent (its own agent code, 1,000 agents in one load generator, against its principal), each on a fresh hub, alternating (docs/benchmarks.md)
.PHONY: bench-grpc-fleet-compare
# argocd-agent never has every hub copy right at 1,000 x 10 (not within 20
# min either): each of its phases is cut at 600 s, which the table prints.
BENCH_GRPC_FLEET_COMPARE_ARGS ?= $(BENCH_GRPC_FLEET_ARGS) --timeout-secs 600
bench-grpc-fleet-compare: bench-grpc-build
	$(BENCH_GRPC) fleet-compare $(BENCH_GRPC_FLEET_COMPARE_ARGS)

## bench-grpc-fleet-ha: the fleet (3,000 simulated agents x 10 Applications) on three hub-controller replicas behind one Service; agents and peak RSS per replica, recovery after killing a serving replica and the leader (docs/benchmarks.md)
.PHONY: bench-grpc-fleet-ha
BENCH_GRPC_FLEET_HA_ARGS ?= --agents 3000 --apps-per-agent 10 --replicas 3
bench-grpc-fleet-ha: bench-grpc-build
	$(BENCH_GRPC) fleet-ha $(BENCH_GRPC_FLEET_HA_ARGS)

## bench-grpc-rollout: one ApplicationSet (Argo CD's applicationset-controller) over 1,000 simulated agents x 10 Applications, one template edit; time to every hub copy at the new revision next to the API server's write ceiling measured in the same run, writes per Application (docs/benchmarks.md)
.PHONY: bench-grpc-rollout
BENCH_GRPC_ROLLOUT_ARGS ?= $(BENCH_GRPC_FLEET_ARGS)
bench-grpc-rollout: bench-grpc-build
	$(BENCH_GRPC) rollout $(BENCH_GRPC_ROLLOUT_ARGS)

## bench-abuse: 100 good agents' latency (p50/p99) quiet and while 10,000 handshakes with bad certificates and one valid agent that floods and never reads abuse the hub; the hub's peak RSS (loopback only)
.PHONY: bench-abuse
BENCH_ABUSE_ARGS ?= --good-agents 100 --bad-handshakes 10000
bench-abuse: bench-grpc-build
	$(BENCH_GRPC) abuse $(BENCH_ABUSE_ARGS)

## bench-trees: the cluster's own tree in the hub's Argo CD: a change on a managed cluster to the hub's argocd-server showing it (p50/p99/min/max over 50 changes), argocd-server's reads of the tree and live states and of a live manifest through the live endpoint and the agent, next to a direct read (p50/p99), BENCH_GRPC_REPEAT times (docs/benchmarks.md)
.PHONY: bench-trees
BENCH_TREES_ARGS ?= --changes 50 --reads 200
bench-trees: bench-grpc-build
	$(BENCH_GRPC) trees $(BENCH_TREES_ARGS)

## bench-logs: a pod's log followed through the hub's argocd-server, the live endpoint and the agent, next to the same lines straight from the cluster's API server: lines per second, BENCH_GRPC_REPEAT times (docs/benchmarks.md)
.PHONY: bench-logs
BENCH_LOGS_ARGS ?= --lines 20000 --reads 5
bench-logs: bench-grpc-build
	$(BENCH_GRPC) logs $(BENCH_LOGS_ARGS)

## bench-live-compare: the live views next to argocd-agent's resource proxy (its principal and agent, v0.9.0) on the same reads of one cluster: a ConfigMap (p50/p99) and a pod's log followed (lines/s), the cluster's API server as the floor (docs/benchmarks.md)
.PHONY: bench-live-compare
BENCH_LIVE_COMPARE_ARGS ?= --reads 204 --lines 20000 --log-reads 6
bench-live-compare: bench-grpc-build
	$(BENCH_GRPC) live-compare $(BENCH_LIVE_COMPARE_ARGS)

bench-grpc-build: tools
	@bash test/tools/build-argocd-agent.sh || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; \
	  echo "bench-grpc: argocd-agent is not available (set ARGOCD_AGENT_SRC, docs/benchmarks.md); its column will say so"; }
	$(CARGO) build --release --locked -p argocd-pull-hub-controller -p argocd-pull-spoke-agent -p argocd-pull-bench -p argocd-pull-test \
	  --bin hub-controller --bin spoke-agent --bin bench-grpc --bin testenv

clean:
	$(CARGO) clean
	rm -rf $(CACHE)
