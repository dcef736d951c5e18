#!/usr/bin/env bash
# Installs the official OpenAI Node SDK, pinned, into third_party/openai-sdk
# for the test that drives pdserve with it (pkg/coordinator, TestOpenAISDK).
# openai 6.30.1 has no dependencies and runs on Node.js 20 (the 7.x series
# needs Node.js 22). No package script runs. Re-running is a no-op once the
# stamp exists; after that nothing here needs the network.
set -euo pipefail
cd "$(dirname "$0")/.."
version=6.30.1
dir=third_party/openai-sdk
stamp=$dir/.installed-$version
[ -f "$stamp" ] && exit 0
command -v npm >/dev/null || { echo "install-openai-sdk: npm is required (Debian package npm, or Node.js)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"
npm install --prefix "$dir" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "openai@$version" >/dev/null
test -f "$dir/node_modules/openai/package.json"
touch "$stamp"
