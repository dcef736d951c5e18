#!/usr/bin/env bash
# Installs the official Anthropic TypeScript SDK, pinned, into
# third_party/anthropic-sdk for the test that drives pdserve's Messages API
# with it (pkg/coordinator, TestAnthropicSDK). @anthropic-ai/sdk 1.17.0
# declares no engines and runs on Node.js 20; its three dependencies come
# with it. No package script runs. Re-running is a no-op once the stamp
# exists; after that nothing here needs the network.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.17.0
dir=third_party/anthropic-sdk
stamp=$dir/.installed-$version
[ -f "$stamp" ] && exit 0
command -v npm >/dev/null || { echo "install-anthropic-sdk: npm is required (Debian package npm, or Node.js)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
npm install --prefix "$dir" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "@anthropic-ai/sdk@$version" >/dev/null
test -f "$dir/node_modules/@anthropic-ai/sdk/package.json"
touch "$stamp"
