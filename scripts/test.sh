#!/usr/bin/env bash
# Runs the checks and tests, in tiers (docs/DESIGN.md, "Tests in tiers"):
#
#   scripts/test.sh unit   T1: formatting, lints, and the unit, property and simulator tests
#                          (no browser, no socket); about 2 minutes warm.
#   scripts/test.sh fast   T1 and T2: also the shared core built for wasm32, the wasm worker's
#                          tests in headless Chromium, and the integration tests over real
#                          sockets, the real binary, TLS and real Chromium tabs.
#   scripts/test.sh        everything (what CI runs): also T3, the long accuracy runs
#                          (`#[ignore]`d by the tier mark, run with --include-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
tier="${1:-all}"
case "$tier" in
    unit | fast | all) ;;
    *)
        echo "usage: scripts/test.sh [unit|fast|all]" >&2
        exit 2
        ;;
esac
start=$(date +%s)
if [ "$tier" != unit ]; then
    setup_wasm_tools
    setup_chromium
    setup_nats
fi

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --workspace --all-targets -- -D warnings

if [ "$tier" = unit ]; then
    say "T1: unit, property and simulator tests"
    cargo test --locked --workspace --lib --bins
    say "tier unit passed in $(( $(date +%s) - start )) s"
    exit 0
fi

cargo clippy --locked --target wasm32-unknown-unknown -p worker-wasm -- -D warnings

say "the shared core builds for wasm32 (no I/O, nothing async)"
cargo check --locked --target wasm32-unknown-unknown -p protocol -p model -p worker-core

say "wasm tests in headless Chromium (wasm = native unfused bit for bit, codec both ways; the GPU path against the CPU's on WebGPU's fallback adapter)"
export CHROMEDRIVER=/usr/bin/chromedriver
# The runner's default is 20 s for a whole test file; the GPU's on SwiftShader takes about
# 15 here, and a fresh machine may be slower.
export WASM_BINDGEN_TEST_TIMEOUT=120
(cd worker-wasm && wasm-pack --log-level warn test --mode no-install --headless --chrome \
    --chromedriver /usr/bin/chromedriver --test web --test gpu -- --nocapture)

build_web_pkg

if [ "$tier" = fast ]; then
    say "T1 and T2: cargo test (unit, property, simulator, integration, headless Chromium)"
    cargo test --locked --workspace
else
    say "cargo test, every tier (T3's long runs included)"
    cargo test --locked --workspace -- --include-ignored
fi

say "all checks of tier $tier passed in $(( $(date +%s) - start )) s"
