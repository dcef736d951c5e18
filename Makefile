# pdserve developer targets. `make test` is the README's test command.
GO ?= go

.PHONY: test race vet fmt generate verify bench

test:
	$(GO) test -race ./...

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

generate:
	cd api && $(GO) tool buf lint && $(GO) tool buf generate

# verify fails when formatting or generated code is not up to date.
verify: generate
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || (gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); echo "gofmt needed"; exit 1)
	git diff --exit-code -- api/
	$(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./pkg/...
