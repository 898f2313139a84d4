#!/usr/bin/env bash
# Runs every check and test: formatting, lints, the shared core built for wasm32, and the
# whole test suite (unit, property, integration over real sockets and processes).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
setup_rust
start=$(date +%s)

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --workspace --all-targets -- -D warnings

say "the shared core builds for wasm32 (no I/O, nothing async)"
cargo check --locked --target wasm32-unknown-unknown -p protocol -p model -p worker-core

say "cargo test"
cargo test --locked --workspace

say "all checks passed in $(( $(date +%s) - start )) s"
