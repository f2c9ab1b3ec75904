# convlog — make targets. `make run` and `make test` are the two that matter.
GO       ?= go
BIN      := bin/convlog
DATA     ?= ./data
LISTEN   ?= 127.0.0.1:8080
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
PKGS     := ./...
FUZZTIME ?= 100000x

.PHONY: all build run test test-short check test-race stress fuzz bench bench-log bench-repl torture torture-long torture-cluster vet fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/convlog
	$(GO) build -o bin/convlog-torture ./cmd/convlog-torture

# Runs the service on its embedded defaults: HTTP on 127.0.0.1:8080, data
# (bbolt log and JetStream store) under ./data.
run: build
	./$(BIN) serve --listen $(LISTEN) --data $(DATA)

# Every test: unit, property, crash (kill -9), end to end over HTTP and
# embedded NATS, external-NATS (127.0.0.1:4222), fuzz seed corpora.
test:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 20m $(PKGS)
	cd cmd/convlog-bench && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

# The fast loop: everything that needs no binary build, no kill -9 and no
# long run (those skip under -short). Under a minute on 2 cores.
test-short:
	$(GO) test -short -count=1 $(PKGS)

# gofmt, vet and staticcheck (pinned) over both modules.
check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	cd cmd/convlog-bench && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

test-race:
	$(GO) test -count=1 -race -timeout 30m $(PKGS)

# The concurrency tests (deliveries, lifecycle, remote workers, streams)
# STRESS_COUNT times each while a busy loop occupies every core: a test
# that fails once in 150 runs fails here. `make stress STRESS_COUNT=50`.
STRESS_COUNT ?= 10
STRESS_RUN   ?= Lifecycle|Deliver|Busy|Remote|Stream|Abort|Settle|Fast|Claim|Status|NeverAhead
stress:
	@set -e; pids=""; for _ in $$(seq $$(nproc)); do sh -c 'while :; do :; done' & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	echo "== $$(nproc) busy loops; each test $(STRESS_COUNT) times"; \
	$(GO) test -count=$(STRESS_COUNT) -timeout 60m -run '$(STRESS_RUN)' ./log/ ./transport/ ./worker/pool/ ./worker/remote/ ./internal/service/

# Each fuzz target for FUZZTIME (go test -fuzz takes one target at a time).
# FUZZTIME is a count (Nx), never a duration: with a duration Go 1.26's fuzz
# coordinator can report "context deadline exceeded" at the deadline on a
# busy machine with no failing input (golang/go#75804, fixed in Go 1.27).
fuzz:
	@set -e; for pkg in ./log ./projection ./transport ./internal/auth ./internal/config ./worker/agentwire; do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

bench-log:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./log/

# The replicated write path prototype (cmd/convlog-bench/replproto, docs/scale-out.md):
# conditional batched publishes to an R3 stream of an in-process 3-node
# cluster (fsync before ack), beside the bare-bbolt group commit.
bench-repl:
	cd cmd/convlog-bench && $(GO) test -run '^$$' -bench . -benchtime 60000x ./replproto/

# The benchmark is a module of its own (cmd/convlog-bench/go.mod), so the
# product never links its PostgreSQL, Redis and plotting dependencies.
bench:
	cd cmd/convlog-bench && $(GO) build -o ../../bin/convlog-bench .
	./bin/convlog-bench

# kill -9 the real service under load, over and over, then verify nothing
# was lost, repeated or left unsettled (docs/operations.md). The short run
# is also part of `make test` (TestTorture*).
torture: build
	./bin/convlog-torture -bin $(BIN) -cycles 3 -clients 8 -sessions 4 -kill-every 2s
	./bin/convlog-torture -bin $(BIN) -cycles 3 -clients 8 -sessions 4 -kill-every 2s -nats-restart

torture-long: build
	./bin/convlog-torture -bin $(BIN) -cycles 20 -clients 32
	./bin/convlog-torture -bin $(BIN) -cycles 20 -clients 32 -nats-restart

# The cluster torture (docs/torture.md): 3 nats-server nodes (built from
# the module go.mod requires: Debian's 2.9 lacks sync_interval), serve
# --workers=0 and 2 convlog workers; each cycle SIGKILLs a worker and the
# node leading the submissions stream. Its short run is TestTortureCluster.
torture-cluster: build
	$(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2
	./bin/convlog-torture -bin $(BIN) -cluster -nats-server bin/nats-server -cycles 10 -clients 4 -sessions 8 -kill-every 3s

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
