# taskrun build, demo and test entry points. Every image is built locally from
# static binaries: nothing is pulled from a registry.

GO      ?= go
BIN     := $(CURDIR)/bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
TASKRUN := $(BIN)/taskrun

# Tests pull images only from their own registry on loopback; testcontainers'
# reaper image cannot be pulled here.
export TESTCONTAINERS_RYUK_DISABLED ?= true

# In CI every part is required: tests that need gVisor, the S3 server, the
# image registry, PostgreSQL, the test cluster or Chromium (the web
# interface's browser tests), python3 and node (the Python and TypeScript
# clients' tests) fail instead of skipping when it is missing.
ifeq ($(CI),true)
export TASKRUN_REQUIRE_S3 := 1
export TASKRUN_REQUIRE_POSTGRES := 1
export TASKRUN_REQUIRE_RUNSC := 1
export TASKRUN_REQUIRE_REGISTRY := 1
export TASKRUN_REQUIRE_KUBE := 1
export TASKRUN_REQUIRE_CHROMIUM := 1
export TASKRUN_REQUIRE_CLIENTS := 1
endif

# go test's -timeout per package: a backstop for a hung test, not a budget.
# The tests' own deadlines scale with the machine's slowdown
# (TASKRUN_TEST_SLOWDOWN, else the load: internal/testdeadline). The root
# package takes about 2 minutes on a quiet machine and 22 at load 25-40, so
# 40m leaves room on a loaded CI machine; on a slower one raise it
# (TEST_TIMEOUT=60m).
TEST_TIMEOUT ?= 40m

# Prepares the machine for the tests; idempotent (see the script's header).
SETUP := GO=$(GO) scripts/test-setup.sh

# Prerequisites run in the order written: setup before images before tests.
.NOTPARALLEL:

.PHONY: all build setup images demo test test-short test-clients bench vet fmt clean kube-up kube-down ui-shots

all: build

## build: static binaries for the host and for the in-container helpers
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

## images: taskrun/agent:local (and taskrun/testbox:local when a static busybox exists)
images: build
	$(TASKRUN) images build --bin-dir $(BIN) $(if $(shell command -v busybox),--testbox,)

## demo: one real sandboxed run of the reference agent on the demo workspace,
## then what it changed there (taskrun diff)
DEMO_RUN := demo-$(shell date +%Y%m%dT%H%M%S)
demo: images
	$(TASKRUN) run --workspace examples/demo/workspace \
		--prompt "$$(cat examples/demo/prompt.txt)" \
		--model scripted --session demo --run-id $(DEMO_RUN)
	@echo; echo "What the agent changed (taskrun diff $(DEMO_RUN)):"
	$(TASKRUN) diff $(DEMO_RUN)

## setup: install and register what the tests need: Debian packages (as root), pinned Go
## tools, runsc with dockerd, hooks in scripts/test-setup.d/
setup:
	@$(SETUP)

## test: set up, vet, then unit, conformance and integration tests (the worker fleet tests
## with 100 runs) against the real Docker
## engine and a real single-node Kubernetes cluster (started for the tests, stopped after,
## unless it was already up: see kube-up)
test: setup images vet
	@kube=0; \
	if [ "$$(id -u)" = 0 ]; then \
	  if scripts/kube-up.sh --hold $$$$ >/dev/null; then kube=1; \
	  elif [ "$(CI)" = true ]; then exit 1; \
	  else echo "warning: the test cluster did not start: its tests will be skipped"; fi; \
	fi; \
	trap '[ $$kube = 0 ] || scripts/kube-down.sh --release $$$$' EXIT; \
	trap 'exit 130' INT TERM; \
	echo "TASKRUN_WORKER_E2E_RUNS=100 TASKRUN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./..."; \
	TASKRUN_WORKER_E2E_RUNS=100 TASKRUN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	@left=$$(docker ps -aq --filter label=dev.taskrun.managed | wc -l); \
	  if [ "$$left" -gt 0 ]; then echo "containers left behind:"; docker ps -a --filter label=dev.taskrun.managed; exit 1; fi

## faults: the fault catalog (docs/faults.md): ./faults (a private dockerd paused and
## killed mid-run, the control plane killed and restarted, PostgreSQL stopped, 32 runs
## in a row) and every fault test the catalog names in other packages; prints one line
## per case (PASS, FAIL, SKIP, NONE)
FAULTS_TIMEOUT ?= 40m
.PHONY: faults
faults: setup images
	@GO=$(GO) TEST_TIMEOUT=$(FAULTS_TIMEOUT) TASKRUN_BIN_DIR=$(BIN) TASKRUN_WORKER_E2E_RUNS=100 scripts/faults.sh

## kube-up: start the test cluster (a real single-node Kubernetes: scripts/kube-up.sh) and
## print its admin kubeconfig's path; it stays up until kube-down. No-op when it is up.
kube-up:
	@scripts/kube-up.sh

## kube-down: stop the test cluster and remove everything it left (processes, mounts,
## bridge, state directory)
kube-down:
	@scripts/kube-down.sh

## test-clients: the Python (clients/python) and TypeScript (clients/typescript) clients'
## tests against a real taskrun serve and worker (part of make test too)
test-clients: images
	TASKRUN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./clients

## test-short: unit tests only (no containers)
test-short:
	$(GO) test -short -count=1 ./...

## bench: side-by-side benchmarks against docker --version (start-up), docker run, cp -a and a raw pipe; the cost of
## signing a run's attestation (budget: 5 ms per run)
bench: setup images
	$(GO) run ./bench
	$(GO) test -run '^$$' -bench Sign ./attest

## ui-shots: screenshots (PNG) of the web interface's run and isolation pages, from
## real runs in headless Chromium, into docs/img/ for the README
ui-shots: setup images
	TASKRUN_BIN_DIR=$(BIN) TASKRUN_UI_SHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run '^TestScreenshots$$' ./webui

## vet: go vet, staticcheck (pinned, installed by the setup script) and gofmt
vet:
	$(GO) vet ./...
	"$$($(SETUP) tool staticcheck)" ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .taskrun
