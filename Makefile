# imshard — `make help` lists the targets.
GO      ?= go
BIN     ?= bin/imshard
CONFIG  ?= config.example.yaml
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
# how long `make robustness` loops random seeds
DURATION ?= 30m
# the version `imshard version` / `--version` print: the nearest tag, else the commit
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/imshard/imshard/cmd.Version=$(VERSION)

.DEFAULT_GOAL := help

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/imshard with its version stamped
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) .

run: ## start local MariaDB + Redis if needed, then `imshard all` on local defaults
	bash test/services.sh
	$(GO) run -ldflags "$(LDFLAGS)" . all --config $(CONFIG)

test: ## every test, against real MariaDB/Redis (started/installed when missing) — the README command
	bash test/run.sh

lint: ## gofmt, go vet, staticcheck, the OpenAPI linter
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	bash test/tools/openapi-lint/lint.sh

bench: ## Go benchmarks (figures, not pass/fail); see docs/performance.md for `imshard bench`
	bash test/services.sh
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

robustness: ## soak: random seeds of the robustness suite for DURATION (default 30m); ROBUSTNESS_SEED=n replays one
	bash test/services.sh
	ROBUSTNESS_DURATION=$(DURATION) $(GO) test -count=1 -timeout 0 -run '^TestRobustnessSoak$$' -v ./test/

fmt: ## gofmt every Go file
	gofmt -w $$(git ls-files '*.go')

.PHONY: help build run test lint bench robustness fmt
