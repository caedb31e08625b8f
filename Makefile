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

# In CI every part is required: tests that need gVisor, the S3 server or the
# image registry fail instead of skipping when it is missing.
ifeq ($(CI),true)
export TASKRUN_REQUIRE_S3 := 1
export TASKRUN_REQUIRE_RUNSC := 1
export TASKRUN_REQUIRE_REGISTRY := 1
endif

# Prepares the machine for the tests; idempotent (see the script's header).
SETUP := GO=$(GO) scripts/test-setup.sh

# Prerequisites run in the order written: setup before images before tests.
.NOTPARALLEL:

.PHONY: all build setup images demo test test-short bench vet fmt clean

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

## test: set up, vet, then unit, conformance and integration tests against the real Docker engine
test: setup images vet
	TASKRUN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 25m ./...
	@left=$$(docker ps -aq --filter label=dev.taskrun.managed | wc -l); \
	  if [ "$$left" -gt 0 ]; then echo "containers left behind:"; docker ps -a --filter label=dev.taskrun.managed; exit 1; fi

## test-short: unit tests only (no containers)
test-short:
	$(GO) test -short -count=1 ./...

## bench: side-by-side benchmarks against docker run, cp -a and a raw pipe
bench: setup images
	$(GO) run ./bench

## vet: go vet, staticcheck (pinned, installed by the setup script) and gofmt
vet:
	$(GO) vet ./...
	"$$($(SETUP) tool staticcheck)" ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .taskrun
