# The service's build, test and run targets. `make help` lists them.

GO          ?= go
GOPATH      := $(shell $(GO) env GOPATH)
STATICCHECK ?= $(GOPATH)/bin/staticcheck
STATICCHECK_VERSION := v0.8.2
# The ofi backend (libfabric through cgo) is built and tested when libfabric
# is installed; `make test` says so plainly when it is not.
HAVE_OFI    := $(shell pkg-config --exists libfabric 2>/dev/null && echo yes)
FUZZTIME    ?= 30s
SEEDS       ?= 100000
ENGINE_SEEDS ?= 20000
BENCHCOUNT  ?= 5
DURATION    ?= 10m

IMAGE       ?= dsmkit/dsm:dev
# docker compose (the plugin) where it is installed, else docker-compose.
COMPOSE     ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

.PHONY: test-ofi-share mixed-version chaos chaos-report failover failover-time rounds durable-rounds soak bench-cluster bench-durable bench-pagestore help run run-docker image image-multistage demo test test-long test-ofi test-ofi-cluster testrace lint fmt bench fuzz sim tools clean clients install-clients

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

run: ## a local three-node dsmd cluster on loopback (data under .run/); Ctrl-C stops it
	GO=$(GO) ./deploy/local/run-cluster.sh

image: ## the container image IMAGE from static binaries built here (deploy/docker/Dockerfile.prebuilt: no registry needed)
	rm -rf .image && mkdir -p .image/bin .image/empty
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s -o .image/bin/ ./cmd/dsmd ./cmd/dsmctl
	docker build -f deploy/docker/Dockerfile.prebuilt -t $(IMAGE) .image

image-multistage: ## the container image IMAGE built inside docker from a golang image (deploy/docker/Dockerfile: needs a registry)
	docker build -f deploy/docker/Dockerfile -t $(IMAGE) .

run-docker: image ## a three-node cluster in containers on loopback (deploy/compose); Ctrl-C stops it
	DSM_IMAGE=$(IMAGE) $(COMPOSE) -f deploy/compose/compose.yaml up

demo: ## two nodes doing one-sided READ, WRITE, CAS and FAA over the tcp transport
	$(GO) run ./rdma/internal/demo

test: ## unit and integration tests with the race detector, the full CI share of simulator seeds, a short chaos run (needs root), the Kubernetes manifests (a module of their own), and the ofi backend's tests when libfabric is installed (make test-long runs the rest: the long real-process tests and the real-cluster share on ofi)
	$(GO) test -race -parallel 4 -timeout 20m ./...
	cd deploy/k8s && $(GO) test -race -timeout 5m ./...
	$(GO) test -count=1 -timeout 10m ./coherence/...
	$(GO) test -count=1 -timeout 10m -run '^TestEngineSim' ./node/engine
	$(GO) run ./tests/chaos/cmd/chaos -short -out $(CURDIR)/tests/chaos/out
	@$(MAKE) --no-print-directory test-ofi

# The share of the real-cluster tests (tests/) that test-ofi-share (in make test-long) runs on dsmd
# --transport ofi, per provider: cross-node coherence, atomics, the mutex and
# the porcupine history on both; a kill and restart of a dsmd on both (on
# shm, each peer has an endpoint of its own, closed when its process is
# gone: rdma/ofi TestDeadPeerDoesNotWedge); the refusal of a mixed cluster
# on shm.
# (-run applies the part after the slash to subtests: only TestCoherentMemory
# has any.)
OFI_CLUSTER_SUB  := /^(BytesAcrossNodes|AddFromAllNodes|MutexIncrement|Linearizable)$$
OFI_CLUSTER_RXM  := ^(TestCoherentMemory|TestMutexHolderOfARestartedNode)$$$(OFI_CLUSTER_SUB)
OFI_CLUSTER_SHM  := ^(TestCoherentMemory|TestClusterTransport|TestMutexHolderOfARestartedNode)$$$(OFI_CLUSTER_SUB)

# The real-process tests that make test skips to stay well within its
# budget on two cores (tests/, longTest): the failover tests that take
# minutes each, then the security (TLS, gossip keys, access, the socket's
# group), cross-language, console, dsmctl and export suites and the
# kill/restart rounds, which start clusters again and again (13 to 65 s
# each under the race detector). CI runs them all.
LONG_TESTS := ^(TestRollingRestartLosesNothing|TestRemoveFailedMember|TestSigtermWritesBack|TestJoinerTakesItsShare|TestDurableSyncReachesDisk|TestGossipKeyring|TestTLSGossipKeyWithoutCertificate|TestTLSStrangerCannotJoinRaft|TestTLSRotation|TestTLSCluster|TestRegionAccess|TestLocalSocketGroup|TestClientsAcrossLanguages|TestSyncAcrossLanguages|TestCMutexFarBackInLine|TestRegionExportImportThroughDsmd|TestWebConsole|TestClusterThroughDsmctl|TestRunClusterScript|TestKilledNodeMakesStatusFail|TestKillRestartRounds|TestDurableShardOutlivesItsCopies|TestSemaphoreAcrossProcesses|TestBarrierAcrossProcesses|TestFaultBoundedWithoutLease|TestCFaultTimeout)$$

test-long: ## the real-process tests that make test skips (the long failover tests: a rolling restart of every node, kill -9 and removal, SIGTERM under writes, a joiner taking its share, durable Sync on disk; then TLS, gossip keys and access, the C and Python clients, the console, dsmctl, export/import, the kill/restart rounds), with the race detector, and the real-cluster share on ofi; CI runs it after make test
	DSM_LONG_TESTS=1 $(GO) test -race -count=1 -timeout 30m -run '$(LONG_TESTS)' ./tests
	@$(MAKE) --no-print-directory test-ofi-share

test-ofi: ## the ofi backend's tests (needs libfabric-dev; make test runs them)
ifeq ($(HAVE_OFI),yes)
	$(GO) test -race -tags ofi -timeout 10m ./rdma/ofi/...
	$(GO) test -tags ofi -count=1 -run 'Transport|OFI|VerbsKind' ./node
else
	@echo "SKIPPED: ofi backend tests: libfabric is not installed (apt-get install libfabric-dev pkg-config)"
endif

test-ofi-share: ## a share of the real-cluster tests on dsmd --transport ofi over tcp;ofi_rxm and shm (needs libfabric-dev; make test-long runs it)
ifeq ($(HAVE_OFI),yes)
	DSM_TEST_TRANSPORT=ofi DSM_TEST_OFI_PROVIDER='tcp;ofi_rxm' $(GO) test -count=1 -p 1 -timeout 10m -run '$(OFI_CLUSTER_RXM)' ./tests
	DSM_TEST_TRANSPORT=ofi DSM_TEST_OFI_PROVIDER=shm $(GO) test -count=1 -p 1 -timeout 10m -run '$(OFI_CLUSTER_SHM)' ./tests
else
	@echo "SKIPPED: ofi cluster tests: libfabric is not installed (apt-get install libfabric-dev pkg-config)"
endif

test-ofi-cluster: ## every real-cluster test (tests/) on dsmd --transport ofi, over tcp;ofi_rxm and then shm, with the race detector (needs libfabric-dev; long)
ifeq ($(HAVE_OFI),yes)
	DSM_LONG_TESTS=1 DSM_TEST_TRANSPORT=ofi DSM_TEST_OFI_PROVIDER='tcp;ofi_rxm' $(GO) test -race -count=1 -p 1 -timeout 60m ./tests
	DSM_LONG_TESTS=1 DSM_TEST_TRANSPORT=ofi DSM_TEST_OFI_PROVIDER=shm $(GO) test -race -count=1 -p 1 -timeout 60m ./tests
else
	@echo "SKIPPED: ofi cluster tests: libfabric is not installed (apt-get install libfabric-dev pkg-config)"
endif

mixed-version: ## one dsmd of the previous release (commit d23d42c, built from git) with two of this build: the old one is refused (docs/operations.md, Upgrade)
	DSM_MIXED_VERSION=1 $(GO) test -race -count=1 -run '^TestMixedVersions$$' -timeout 10m ./tests

testrace: test ## alias of test: the race detector is always on

lint: tools ## go vet and staticcheck (with the ofi tag too when libfabric is installed)
	$(GO) vet ./...
	$(STATICCHECK) ./...
	cd deploy/k8s && $(GO) vet ./... && $(STATICCHECK) ./...
ifeq ($(HAVE_OFI),yes)
	$(GO) vet -tags ofi ./rdma/... ./node/... ./cmd/...
	$(STATICCHECK) -tags ofi ./rdma/... ./node/... ./cmd/...
endif
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

fmt: ## gofmt the tree
	gofmt -w .

bench: ## transport benchmarks (compare runs with benchstat)
	$(GO) test ./rdma -run '^$$' -bench . -benchmem -count $(BENCHCOUNT)

bench-cluster: ## data-path benchmarks on real dsmd clusters of 3 and 9 nodes (docs/benchmarks.md)
	$(GO) test ./tests -run '^$$' -bench '^Benchmark(Cluster|WriteSharers9)$$' -benchtime 1000x -count 3 -timeout 30m

bench-durable: RESTART_BYTES = 1073741824
bench-durable: ## Sync of a Durable region against a Memory one and a raw synced pebble batch, then a whole-cluster restart with RESTART_BYTES of durable pages (1 GiB): time to healthy and to a full read (docs/benchmarks.md)
	$(GO) test ./tests -run '^$$' -bench '^BenchmarkDurableSync$$' -benchtime 200x -count $(BENCHCOUNT) -timeout 30m
	DSM_RESTART_BYTES=$(RESTART_BYTES) $(GO) test ./tests -run '^$$' -bench '^BenchmarkDurableRestart$$' -benchtime 1x -count 1 -timeout 60m

# The page store and dd write to the same directory, so that the three
# figures are of one disk.
PAGESTORE_BENCH_DIR ?= $(CURDIR)/.bench-pagestore

bench-pagestore: ## the durable page store's group commit against raw synced pebble batches, and dd with fsync, on one disk (PAGESTORE_BENCH_DIR; docs/benchmarks.md)
	mkdir -p $(PAGESTORE_BENCH_DIR)
	DSM_PAGESTORE_BENCH_DIR=$(PAGESTORE_BENCH_DIR) $(GO) test ./node/pagestore -run '^$$' -bench . -benchtime 2000x -count $(BENCHCOUNT)
	dd if=/dev/zero of=$(PAGESTORE_BENCH_DIR)/dd.tmp bs=4M count=64 oflag=direct conv=fsync
	rm -f $(PAGESTORE_BENCH_DIR)/dd.tmp

fuzz: ## run every fuzz target of the tree, one after another, for FUZZTIME each, and print the executions in all
	GO=$(GO) FUZZTIME=$(FUZZTIME) TAGS="$(if $(HAVE_OFI),-tags ofi)" ./tests/fuzz-all.sh

soak: ## region life cycles on a real cluster for DURATION; fails when goroutines, descriptors or RSS grow per cycle (samples in .soak/)
	$(GO) test ./tests -run '^TestSoak$$$$' -count=1 -soak $(DURATION) -soak-out $(CURDIR)/.soak/samples.csv -timeout 0 -v

sim: ## run SEEDS simulator seeds of the coherence protocol across all configurations (make sim SEEDS=1000000), then ENGINE_SEEDS seeds per configuration of the engine simulation, then 400 random placement histories (walks against the reference walk, resumed walks and walks from checkpoints against walks)
	$(GO) test ./coherence/sim -run '^TestSimSeeds$$' -seeds=$(SEEDS) -workers=$$(nproc) -timeout 0 -v
	$(GO) test ./node/engine -run '^TestEngineSim$$' -engine-seeds=$(ENGINE_SEEDS) -timeout 0 -v
	DSM_LONG_TESTS=1 $(GO) test ./node -run '^(TestWalkIsReference|TestResumeIsWalk|TestCheckpointIsWalk)$$' -count=1 -timeout 0 -v

chaos: SEEDS = 1
chaos: DURATION = 60s
chaos: FAULTS ?= all
chaos: OFI ?=
chaos: ## SEEDS schedules of DURATION on real dsmd clusters in network namespaces under a seeded nemesis (FAULTS: all or a list; OFI='tcp;ofi_rxm' or shm: dsmd on libfabric); needs root; exit 0 only without violations (runs in tests/chaos/out/)
	$(GO) run ./tests/chaos/cmd/chaos -seeds $(SEEDS) -duration $(DURATION) -faults $(FAULTS) $(if $(OFI),-ofi '$(OFI)') -out $(CURDIR)/tests/chaos/out

chaos-report: RUNS ?= $(CURDIR)/tests/chaos/out
chaos-report: ## sum the verdicts of earlier chaos runs (RUNS: run directories or directories of them; tests/chaos/out by default): faults, operations, violations, availability per fault kind
	$(GO) run ./tests/chaos/cmd/chaos -report $(RUNS)

failover: ROUNDS = 5
failover: SEEDS = 1
failover: DURATION = 45s
failover: ## the real-process failure tests ROUNDS times (kill -9 and restart of a home, SIGTERM, poisoned faults), then SEEDS chaos schedules of DURATION under kill, leave, join and pause (needs root)
	DSM_LONG_TESTS=1 $(GO) test ./tests -run '^(TestKilledHomeFailsOver|TestRemoveFailedMember|TestSigtermWritesBack|TestUnavailablePageFails)$$' -count=$(ROUNDS) -timeout 0 -v
	$(GO) run ./tests/chaos/cmd/chaos -seeds $(SEEDS) -duration $(DURATION) -faults kill,leave,join,pause -out $(CURDIR)/tests/chaos/out

failover-time: ROUNDS = 10
failover-time: RESTART = 1
failover-time: ## failover time of a home killed with kill -9 and restarted at once (RESTART=0: not restarted; the failure verdict moves its pages), ROUNDS rounds on a three-node cluster (median, min, max)
	DSM_FAILOVER_ROUNDS=$(ROUNDS) DSM_FAILOVER_RESTART=$(RESTART) $(GO) test ./tests -run '^TestFailoverTime$$' -count=1 -timeout 0 -v

rounds: ROUNDS = 20
rounds: NODES ?= 3
rounds: SEED ?=
rounds: ## ROUNDS rounds of kill -9 and restart of a random dsmd of NODES (3) under a register workload on every node (SEED replays a schedule): no synced write lost, a linearizable history, no call past the no-hang bound (make test-long runs 3 rounds)
	DSM_LONG_TESTS=1 DSM_ROUNDS=$(ROUNDS) DSM_ROUNDS_NODES=$(NODES) DSM_ROUNDS_SEED=$(SEED) $(GO) test ./tests -run '^TestKillRestartRounds$$' -count=1 -timeout 0 -v

durable-rounds: ROUNDS = 20
durable-rounds: SEED ?=
durable-rounds: ## ROUNDS rounds of kill -9 of every dsmd of three at once and a restart of all, with synced and unsynced writes to a Durable region and a Memory region in between (SEED replays the writes): every page reads back as the last synced image, the memory region reads zeros and says "contents lost at restart" (make test runs 1 round)
	DSM_DURABLE_ROUNDS=$(ROUNDS) DSM_DURABLE_SEED=$(SEED) $(GO) test ./tests -run '^TestWholeClusterRestart$$' -count=1 -timeout 0 -v

tools: ## install the linters this Makefile uses
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

clients: ## the C library (clients/c: libdsm.a, libdsm.so, dsm.pc) and its example; the Python package is clients/python (docs/clients.md)
	$(MAKE) -C clients/c PREFIX=$(or $(PREFIX),/usr/local)

install-clients: ## install dsm.h, libdsm.a, libdsm.so and dsm.pc under PREFIX (default /usr/local): PREFIX/include, PREFIX/lib, PREFIX/lib/pkgconfig
	$(MAKE) -C clients/c install PREFIX=$(or $(PREFIX),/usr/local)

clean: ## remove build outputs and local run data
	rm -rf bin .run .image .bench-pagestore
	$(MAKE) -C clients/c clean
