# taskrun build, demo and test entry points. Every image is built locally from
# static binaries: nothing is pulled from a registry.

GO      ?= go
BIN     := $(CURDIR)/bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
TASKRUN := $(BIN)/taskrun

# Tests never pull images; testcontainers' reaper image cannot be pulled here.
export TESTCONTAINERS_RYUK_DISABLED ?= true

.PHONY: all build images demo test test-short bench vet fmt clean

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

## test: vet, then unit, conformance and integration tests against the real Docker engine
test: images vet
	@command -v busybox >/dev/null || { echo "make test needs a static busybox for taskrun/testbox:local: apt-get install busybox-static"; exit 1; }
	TASKRUN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 25m ./...
	@left=$$(docker ps -aq --filter label=dev.taskrun.managed | wc -l); \
	  if [ "$$left" -gt 0 ]; then echo "containers left behind:"; docker ps -a --filter label=dev.taskrun.managed; exit 1; fi

## test-short: unit tests only (no containers)
test-short:
	$(GO) test -short -count=1 ./...

## bench: side-by-side benchmarks against docker run, cp -a and a raw pipe
bench: images
	$(GO) run ./bench

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN) .taskrun
