#!/usr/bin/env bash
# A whole cluster on this machine (docs/CLUSTER.md): a nats-server with JetStream on, a free
# loopback port and a temporary store; a root; and EDGES edges (default 3) on ports 8081...,
# each training on its own part of the train split. Volunteers open any edge's page; native
# workers take every edge's URL: worker --url ws://127.0.0.1:8081/ws,ws://127.0.0.1:8082/ws --reconnect
#
#   scripts/cluster.sh [EDGES] [-- FLAGS for every coordinator process]
#
# Ctrl-C stops everything, nats-server included, and removes its store.
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."
root="$PWD"
source scripts/setup.sh
setup_nats
setup_wasm_tools
build_web_pkg
cargo build --release --locked -p server --bin coordinator
coordinator="${CARGO_TARGET_DIR:-$root/target}/release/coordinator"
edges="${1:-3}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
store=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$store"' EXIT
trap 'exit 130' INT TERM
"$NATS_SERVER" -a 127.0.0.1 -p -1 -js -sd "$store" 2> "$store/nats.log" &
# Its log says where it listens once it is ready.
for _ in $(seq 100); do
    grep -q "Server is ready" "$store/nats.log" && break
    sleep 0.1
done
port=$(sed -n 's/.*Listening for client connections on 127.0.0.1:\([0-9]*\).*/\1/p' "$store/nats.log")
[ -n "$port" ] || { cat "$store/nats.log" >&2; exit 1; }
nats="nats://127.0.0.1:$port"
say "nats-server on $nats (store $store)"
cd "$caller"
"$coordinator" --role root --nats "$nats" --node-name root "$@" &
for i in $(seq 1 "$edges"); do
    "$coordinator" --role edge --nats "$nats" --node-name "edge-$i" \
        --port $((8080 + i)) --data-part "$i/$edges" "$@" &
done
say "root and $edges edges started: volunteers open http://127.0.0.1:8081/ (or 8082...)"
wait
