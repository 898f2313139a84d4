#!/usr/bin/env bash
# Runs the coordinator on its embedded default (MNIST, 784-128-10 MLP, Adam), building
# everything it serves first. Extra arguments go to the coordinator: scripts/run.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
setup_rust
exec cargo run --release --locked -p server --bin coordinator -- "$@"
