# convlog — make targets. `make run` and `make test` are the two that matter.
GO       ?= go
BIN      := bin/convlog
DATA     ?= ./data
PKGS     := ./...
FUZZTIME ?= 5s

.PHONY: all build run test test-race fuzz bench bench-log torture torture-long vet fmt clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/convlog

# Runs the service on its embedded defaults: HTTP on 127.0.0.1:8080, data
# (bbolt log and JetStream store) under ./data.
run: build
	./$(BIN) serve --data $(DATA)

# Every test: unit, property, crash (kill -9), end to end over HTTP and
# embedded NATS, external-NATS (127.0.0.1:4222), fuzz seed corpora.
test:
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 20m $(PKGS)

test-race:
	$(GO) test -count=1 -race -timeout 30m $(PKGS)

# Each fuzz target for FUZZTIME (go test -fuzz takes one target at a time).
fuzz:
	@set -e; for pkg in ./log ./projection ./transport; do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

bench-log:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./log/

bench: build
	./$(BIN) bench

# kill -9 the real service under load, over and over, then verify nothing
# was lost, repeated or left unsettled (docs/operations.md). The short run
# is also part of `make test` (TestTorture*).
torture: build
	./$(BIN) torture -cycles 3 -clients 8 -sessions 4 -kill-every 2s
	./$(BIN) torture -cycles 3 -clients 8 -sessions 4 -kill-every 2s -nats-restart

torture-long: build
	./$(BIN) torture -cycles 20 -clients 32
	./$(BIN) torture -cycles 20 -clients 32 -nats-restart

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
