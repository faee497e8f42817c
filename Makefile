# Tether developer entry points. `make test` is what CI runs (.ci/run).
SHELL := /usr/bin/env bash
# Tool versions and the image's Rust target (IMAGE_RUST_TARGET): one place, shared with e2e/tools.sh.
include e2e/versions.env
CARGO ?= cargo
export CARGO_TERM_PROGRESS_WHEN ?= auto

.PHONY: help demo demo-down tools image release generate check-generated fmt lint build test test-compat test-upgrade bench bench-leader bench-agent soak bench-costs bench-proxy bench-liveness clean-tools

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

demo: image ## Start a local leader + 2 members sandbox of real pods (kept running; stop with make demo-down)
	@echo "== building tether-controller and tether"
	$(CARGO) build --locked -p tether-controller -p tether-cli
	$(CARGO) run --locked -q -p tether-e2e --example demo

demo-down: ## Stop the sandbox started by make demo (nodes, pods, control planes) and remove .sandbox
	$(CARGO) run --locked -q -p tether-e2e --example demo -- down

tools: ## Install the pinned control plane, node binaries, etcd, helm 4 and 3, kubectl, and the node tier's packages (cached)
	@bash e2e/tools.sh

image: tools ## Build the image from the Dockerfile without a daemon or registry (target/images/tether.tar)
	@bash e2e/image.sh

release: tools ## Build every release artifact into target/release-artifacts (CLI archives, charts, multi-arch image, krew manifest, SBOM, SHA256SUMS; docs/releasing.md)
	@bash e2e/release.sh

generate: ## Regenerate config/crd from the Rust types and docs/metrics.md from the metric registries
	$(CARGO) run --locked -q -p tether-api --example crdgen
	$(CARGO) run --locked -q -p tether-controller --example metricsdoc

check-generated: ## Fail if config/crd or docs/metrics.md differs from what the code generates
	$(CARGO) run --locked -q -p tether-api --example crdgen -- --check
	$(CARGO) run --locked -q -p tether-controller --example metricsdoc -- --check

fmt: ## Format the code
	$(CARGO) fmt --all

lint: ## rustfmt check and clippy with warnings denied
	@rustup component add rustfmt clippy >/dev/null 2>&1 || true
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked -p tether-controller --features heap-stats --all-targets -- -D warnings

build: ## Build every crate
	$(CARGO) build --locked --workspace --all-targets

test: ## Everything CI checks, as one job graph (e2e/runner: tools, generated files, lints, the image, the release's quick checks, unit, real-cluster and real-pod tests, side by side where they wait); ends with where the time went (target/test-times.txt). ONLY=e2e/agent runs a part and what it needs
	$(CARGO) run --locked -q -p tether-testrun -- $(ONLY)

test-compat: image ## The member-side tests on every supported Kubernetes version (e2e/versions.env; builds them once, cached; about 40 min; NODES=0 skips the node tier)
	@bash e2e/tools.sh --compat
	$(CARGO) build --locked -p tether-controller -p tether-cli -p tether-sim
	TETHER_COMPAT_NODES=$(if $(filter 0,$(NODES)),0,1) CARGO="$(CARGO)" e2e/compat.sh

test-upgrade: image ## Upgrade from an earlier release on real nodes: FROM=v0.1.0 (its image is built in target/upgrade/FROM; about 15 min after that)
	$(CARGO) build --locked -p tether-controller -p tether-cli
	FROM="$(FROM)" CARGO="$(CARGO)" e2e/upgrade.sh

bench: tools ## Benchmark: one leader against N simulated members (N="100 1000 5000 10000" by default; tens of minutes; TTL=600 also measures credential renewals; FAILOVERS=K repeats the failover; FAILOVER_BINS=dirA,dirB runs those builds in turn; PROFILES=1 also publishes ClusterProfiles and counts their writes)
	$(CARGO) build --locked --release -p tether-controller
	TETHER_BIN_DIR=$(CURDIR)/target/release $(CARGO) run --locked --release -q -p tether-e2e --example scale_bench -- $(N) $(if $(TTL),--credential-ttl $(TTL)) $(if $(FAILOVERS),--failovers $(FAILOVERS)) $(if $(FAILOVER_BINS),--failover-bins $(FAILOVER_BINS)) $(if $(PROFILES),--cluster-profiles)

# The soak runs the leader binary that the image ships (static musl: its allocator is the one
# users run); BUILD=host runs the host's glibc release build instead. By default that binary is
# built with the heap-stats feature (live heap bytes on /metrics: the soak judges a leak on the
# live heap and reports RSS beside it) in its own target directory, so the image's binary is
# never replaced by it. HEAP=0 runs the image's binary itself and judges RSS.
SOAK_HEAP = $(if $(filter 0,$(HEAP)),,1)
SOAK_TARGET_DIR = $(if $(SOAK_HEAP),$(CURDIR)/target/heap-stats,$(CURDIR)/target)
SOAK_BIN_DIR = $(SOAK_TARGET_DIR)/$(if $(filter host,$(BUILD)),release,$(IMAGE_RUST_TARGET)/release)
SOAK_CARGO_FLAGS = --locked --release -p tether-controller $(if $(SOAK_HEAP),--features tether-controller/heap-stats --target-dir $(SOAK_TARGET_DIR))

soak: tools ## Soak: a leader with N simulated members for DURATION under random faults (N=1000 DURATION=30m; WITHOUT=leader-killed,... leaves faults out; BUILD=host: the glibc build, not the image's; HEAP=0: the image's binary as is, RSS judged instead of the live heap); prints the recovery table
	$(if $(filter host,$(BUILD)),$(CARGO) build $(SOAK_CARGO_FLAGS),$(if $(SOAK_HEAP),CC_x86_64_unknown_linux_musl=musl-gcc $(CARGO) build --target $(IMAGE_RUST_TARGET) $(SOAK_CARGO_FLAGS),@bash e2e/image.sh))
	TETHER_BIN_DIR=$(SOAK_BIN_DIR) $(CARGO) run --locked --release -q -p tether-e2e --example soak -- \
	  --members $(or $(N),1000) --duration $(or $(DURATION),30m) $(if $(WITHOUT),--without $(WITHOUT))

bench-costs: tools ## Benchmark: API server cost per write kind, and the ceiling of registration throughput (writes alone)
	$(CARGO) run --locked --release -q -p tether-e2e --example write_costs -- 20

bench-leader: tools ## Benchmark: request→Approved p50/p99 and leader writes per registration (N=200)
	$(CARGO) run --locked --release -q -p tether-e2e --example approval_bench -- 200 10

bench-agent: tools ## Benchmark: the agent (the image's musl binary) on a member with N nodes (5000) at idle and under CHURN node status writes/s (100): RSS, CPU, writes by kind
	@bash e2e/image.sh
	TETHER_BIN_DIR=$(CURDIR)/target/$(IMAGE_RUST_TARGET)/release $(CARGO) run --locked --release -q -p tether-e2e --example agent_bench -- $(or $(N),5000) $(or $(CHURN),100)

clean-tools: ## Remove .tools (the version-keyed cache in ~/.cache/tether stays)
	rm -rf .tools

bench-liveness: tools ## Benchmark: liveness from the tunnel with N simulated members holding real tunnels (N="1000 5000 10000"): cost per member and per tunnel, steady writes, killed/frozen agents to Unknown, a failover (ARGS=--attach-at-join: tunnels dialled as members join, registration as a fleet sees it; ARGS="--attach-rate R": the leader's attach pace; ARGS="--api-servers K": K kube-apiservers in front of one etcd, for more tunnels than one process may hold open files for); runs the image's musl leader binary; needs root
	@bash e2e/image.sh
	TETHER_BIN_DIR=$(CURDIR)/target/$(IMAGE_RUST_TARGET)/release $(CARGO) run --locked --release -q -p tether-e2e --example liveness_bench -- $(or $(N),1000 5000 10000) $(ARGS)

bench-proxy: tools ## Benchmark: member access, proxy vs direct (latency, large list, a stalled reader) and leader cost per idle tunnel (N=1000); needs root
	$(CARGO) build --locked --release -p tether-controller
	TETHER_BIN_DIR=$(CURDIR)/target/release $(CARGO) run --locked --release -q -p tether-e2e --example proxy_bench -- $(or $(N),1000)
