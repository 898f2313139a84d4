#!/usr/bin/env bash
# Runs every check and test: formatting, lints, the shared core built for wasm32, the wasm
# worker's tests in headless Chromium, and the whole native suite (unit, property,
# integration over real sockets, the real binary, and real headless Chromium tabs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
start=$(date +%s)
setup_wasm_tools
setup_chromium

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo clippy --locked --target wasm32-unknown-unknown -p worker-wasm -- -D warnings

say "the shared core builds for wasm32 (no I/O, nothing async)"
cargo check --locked --target wasm32-unknown-unknown -p protocol -p model -p worker-core

say "wasm tests in headless Chromium (wasm vs native gradient, codec both ways)"
export CHROMEDRIVER=/usr/bin/chromedriver
(cd worker-wasm && wasm-pack --log-level warn test --mode no-install --headless --chrome \
    --chromedriver /usr/bin/chromedriver --test web -- --nocapture)
say "the same, against a native reference computed without FMA: must be bitwise identical"
(cd worker-wasm && MMTEST_FEATURE=sse2 wasm-pack --log-level warn test --mode no-install \
    --headless --chrome --chromedriver /usr/bin/chromedriver --test web -- --nocapture)

build_web_pkg

say "cargo test (unit, property, integration, end-to-end in headless Chromium)"
cargo test --locked --workspace

say "all checks passed in $(( $(date +%s) - start )) s"
