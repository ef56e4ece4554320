.PHONY: test vet fmt bench

# The test command: a throwaway PostgreSQL, go vet, and the whole suite with -race.
test:
	bash scripts/test.sh

# Every benchmark of docs/performance.md with its target, on a throwaway
# PostgreSQL with default durability; `make bench BENCH="e2e host"` runs some.
bench:
	bash scripts/bench.sh $(BENCH)

# vet also builds for a 32-bit target (a constant over 2^31 compared with an
# int compiles on amd64 only) and vets the packages with per-OS code for macOS.
vet:
	go vet ./...
	GOARCH=386 go build -o /dev/null ./...
	GOOS=darwin go vet ./sidecar ./hostsdk/... ./aip

fmt:
	gofmt -l -w $$(git ls-files '*.go')
