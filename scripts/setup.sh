#!/usr/bin/env bash
# Idempotent installs shared by scripts/run.sh and scripts/test.sh. Every step checks first
# and skips what is already there at the right version, so a second run costs nothing.
# Versions and the reasons for each flag: docs/TOOLCHAIN.md.

WASM_PACK_VERSION=0.15.1

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

setup_rust() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        say "installing the wasm32-unknown-unknown target"
        rustup target add wasm32-unknown-unknown
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

# Debian's Chromium and ChromeDriver, for the headless-browser tests.
setup_chromium() {
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        say "installing Debian chromium and chromium-driver (one-time, ~1 min)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
}

# Builds the browser worker into web/pkg, which the coordinator serves. Incremental: about a
# second when nothing changed. wasm-opt is off (worker-wasm/Cargo.toml) and --mode no-install
# makes a missing tool fail at once instead of compiling for minutes.
build_web_pkg() {
    say "building the browser worker (web/pkg)"
    wasm-pack --log-level warn build --mode no-install --target web --release \
        --out-dir ../web/pkg worker-wasm
}
