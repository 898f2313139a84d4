#!/usr/bin/env bash
# Idempotent installs shared by scripts/run.sh and scripts/test.sh. Each step checks first
# and skips what is already there, so a second run costs nothing.

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

setup_rust() {
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        say "installing the wasm32-unknown-unknown target"
        rustup target add wasm32-unknown-unknown
    fi
}
