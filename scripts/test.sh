#!/usr/bin/env bash
# Runs the checks and tests, in tiers (docs/DESIGN.md, "Tests in tiers"):
#
#   scripts/test.sh unit   T1: formatting, lints, and the unit, property and simulator tests
#                          (no browser, no socket; the attack surveys in virtual time).
#   scripts/test.sh fast   T1 but the simulated attack surveys, and the integration tests that
#                          open no browser: real sockets, the real binary, TLS, a real
#                          nats-server. For iterating; under 5 minutes warm.
#   scripts/test.sh        everything (what CI runs): also the shared core built for wasm32,
#                          the wasm worker's tests in headless Chromium (in both builds, with
#                          and without relaxed SIMD) and the integration
#                          tests in real Chromium tabs. Under 20 minutes warm.
#
# Tests run under cargo-nextest (.config/nextest.toml), and every run ends with its ten
# slowest tests. The long runs to a target are benchmarks, not tests: bench/long-runs.sh.
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
setup_nextest
if [ "$tier" = all ]; then
    setup_wasm_tools
    setup_chromium
fi
if [ "$tier" != unit ]; then
    setup_nats
fi

# Each nextest run's JUnit report is kept here; the ten slowest of them all are printed at
# the end, whether the run passed or not.
reports=$(mktemp -d)
slowest() {
    local status=$?
    if compgen -G "$reports/*.xml" >/dev/null; then
        python3 scripts/slowest.py "$reports"/*.xml || true
    fi
    rm -rf "$reports"
    return $status
}
trap slowest EXIT
nextest() {
    local name=$1
    shift
    local code=0
    cargo nextest run --locked --workspace "$@" || code=$?
    cp target/nextest/default/junit.xml "$reports/$name.xml" 2>/dev/null || true
    return $code
}

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --workspace --all-targets -- -D warnings

say "T1: unit, property and simulator tests"
if [ "$tier" = fast ]; then
    # The attack surveys (minutes of CPU in virtual time) are left to `unit` and CI.
    nextest unit --lib --bins -E 'not (package(sim) & test(/^(survey_tests|gpt_tests)::/))'
else
    nextest unit --lib --bins
fi
if [ "$tier" = unit ]; then
    say "tier unit passed in $(( $(date +%s) - start )) s"
    exit 0
fi

if [ "$tier" = fast ]; then
    say "T2: the integration tests that open no browser (real sockets, the binary, NATS)"
    nextest integration -E 'kind(test) & not test(/^(browser|links|gpu_phases)::/)'
    say "all checks of tier fast passed in $(( $(date +%s) - start )) s"
    exit 0
fi

cargo clippy --locked --target wasm32-unknown-unknown -p worker-wasm -- -D warnings
with_relaxed_simd cargo clippy --locked --target wasm32-unknown-unknown -p worker-wasm -- -D warnings

say "the shared core builds for wasm32 (no I/O, nothing async)"
cargo check --locked --target wasm32-unknown-unknown -p protocol -p model -p worker-core

say "wasm tests in headless Chromium (wasm = native unfused bit for bit, codec both ways; the GPU path against the CPU's on WebGPU's fallback adapter)"
export CHROMEDRIVER=/usr/bin/chromedriver
# The runner's default is 20 s for a whole test file; the GPU's on SwiftShader takes about
# 15 here, and a fresh machine may be slower.
export WASM_BINDGEN_TEST_TIMEOUT=120
wasm_start=$(date +%s)
(cd worker-wasm && wasm-pack --log-level warn test --mode no-install --headless --chrome \
    --chromedriver /usr/bin/chromedriver --test web --test gpu -- --nocapture)
say "the wasm tests again in the build with relaxed SIMD (a tab whose multiply-adds fuse = native fused, bit for bit)"
# In the release profile, so that its dependencies are the ones web/pkg-relaxed is built from.
(cd worker-wasm && with_relaxed_simd wasm-pack --log-level warn test --mode no-install --release \
    --headless --chrome --chromedriver /usr/bin/chromedriver --test web -- --nocapture)
say "the wasm tests took $(( $(date +%s) - wasm_start )) s"

build_web_pkg

say "T2: the integration tests (real sockets, the binary, TLS, NATS, real Chromium tabs)"
nextest integration -E 'kind(test)'

say "all checks of tier $tier passed in $(( $(date +%s) - start )) s"
