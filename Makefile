.PHONY: test vet fmt bench

# The test command: a throwaway PostgreSQL, go vet, and the whole suite with -race.
test:
	bash scripts/test.sh

vet:
	go vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')
