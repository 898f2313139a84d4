#!/usr/bin/env bash
# Runs the coordinator on its embedded default (MNIST, 784-128-10 MLP, Adam) at
# http://127.0.0.1:8080/, building everything it serves first (the wasm worker too).
# Extra arguments go to the coordinator: scripts/run.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
setup_wasm_tools
build_web_pkg
exec cargo run --release --locked -p server --bin coordinator -- "$@"
