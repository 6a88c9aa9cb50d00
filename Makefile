# tpsched: `make help` lists the targets.
GO      ?= go
BIN     := bin
GOFLAGS ?=
# The race detector slows shared-memory spinning; the tests bound their own time.
TEST_TIMEOUT ?= 30m

.PHONY: help build test test-short bench demo generate lint fuzz clean

help: ## list the targets
	@awk -F':.*## ' '/^[a-zA-Z_-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build scdd, scdctl and uap-echo into bin/
	$(GO) build $(GOFLAGS) -o $(BIN)/ ./cmd/...

test: ## run every test with the race detector (integration tests start real scdd and UAP processes)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

test-short: ## unit tests only, no processes started
	$(GO) test -short -count=1 ./...

bench: build ## closed-loop echo: tpsched beside a bare gnet echo server, written to bench/results/
	$(GO) run ./bench/cmd/echobench -out bench/results

demo: build ## start a node on the embedded default, call demo/echo, show status, stop it
	@bash tools/demo.sh $(BIN)

generate: ## regenerate generated code (eBPF objects once they exist)
	$(GO) generate ./...

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

fuzz: ## run each fuzz target for 30 s
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 30s ./scd/def/
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./netio/

clean: ## remove bin/
	rm -rf $(BIN)
