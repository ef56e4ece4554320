.PHONY: test vet fmt bench

# The test command: a throwaway PostgreSQL, go vet, and the whole suite with -race.
test:
	bash scripts/test.sh

# Every benchmark of docs/performance.md with its target, on a throwaway
# PostgreSQL with default durability; `make bench BENCH="e2e host"` runs some.
bench:
	bash scripts/bench.sh $(BENCH)

vet:
	go vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')
