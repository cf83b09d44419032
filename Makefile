# beam — build, run and test. `make test` is what CI runs (.ci/run).
GO       ?= go
PKGS     ?= ./...
# Timeout for the whole race-enabled test run; CI's budget is far larger.
TEST_TIMEOUT ?= 25m

.PHONY: all build run test test-short lint bench fuzz clean

all: lint build test

## build: compile the beam binary into bin/beam
build:
	$(GO) build -o bin/beam ./cmd/beam

## run: start a directory on embedded defaults (SQLite in ./beam-data, port 3100); ARGS=--demo adds demo agents
run:
	$(GO) run ./cmd/beam serve $(ARGS)

## test: every test, with the race detector
test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

## test-short: the quick local loop (-short shrinks the chaos and federation volume runs)
test-short:
	$(GO) test -race -short -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

## lint: go vet, gofmt, staticcheck (pinned in go.mod as a tool), a tidy go.mod, and the surface and layout
## rules (no exported name unused outside its package unless the package is a public API; leaves stay leaves)
lint:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -run '^(TestNoUnusedExports|TestLayoutReadsOneWay)$$' .
	$(GO) tool staticcheck $(PKGS)
	$(GO) mod tidy -diff
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: the Go benchmarks, without the race detector (numbers go to docs/BENCHMARKS.md)
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## fuzz: run each fuzz target for a short while
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 20s $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf bin
