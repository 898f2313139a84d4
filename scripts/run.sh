#!/usr/bin/env bash
# Runs the coordinator on its embedded default (MNIST, 784-128-10 MLP, Adam) at
# http://127.0.0.1:8080/, building everything it serves first (the wasm worker too).
# Extra arguments go to the coordinator: scripts/run.sh --help
set -euo pipefail
# Paths in the arguments (--data, --model FILE, --init) are the caller's, so the coordinator
# runs in the caller's directory.
caller="$PWD"
cd "$(dirname "$0")/.."
root="$PWD"
source scripts/setup.sh
setup_wasm_tools
build_web_pkg
cd "$caller"
exec cargo run --release --locked --manifest-path "$root/Cargo.toml" -p server --bin coordinator -- "$@"
