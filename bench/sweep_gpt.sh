#!/usr/bin/env bash
# The local-steps sweep for a language model, in virtual time: nanoGPT's CPU configuration
# (0.8M parameters, batch 12, context 64) on the embedded Shakespeare, 4 workers, each step
# 116 ms (this machine's, measured), H ∈ {1, 16, 64, auto} × links {loopback, 50 ms /
# 10 Mbit/s, 150 ms / 5 Mbit/s}, 60 virtual seconds each. Prints a markdown table: the
# workers' compute share, updates, tokens trained, validation loss at the end, bytes on the
# wire per token. Every simulated step is computed for real, so a point costs up to 4
# minutes here (4 workers × 60 s × their compute share); docs/BENCHMARKS.md ("A GPT's
# sweep") has its output.
#
#   cargo build --release -p bench && bench/sweep_gpt.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIM=${SIM:-${CARGO_TARGET_DIR:-target}/release/sim}
TIME=${TIME:-60s}
STEP=${STEP:-116ms}
echo "| link | H | compute share | updates | tokens | validation loss | bytes per token |"
echo "|---|---|---|---|---|---|---|"
for link in "loopback|0/0" "50 ms, 10 Mbit/s|50ms/10" "150 ms, 5 Mbit/s|150ms/5"; do
    name=${link%%|*}
    spec=${link#*|}
    for h in 1 16 64 auto; do
        # Evaluate about ten times a run whatever H is.
        case $h in 1) every=50 ;; 16) every=4 ;; *) every=1 ;; esac
        json=$("$SIM" --workers 4 --link "$spec" --step "$STEP" --max-time "$TIME" \
            --coordinator "--model gpt --batch-size 12 --local-steps $h --eval-interval $every" | tail -1)
        row=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
tokens = r["samples"] * 64
loss = "–" if r["loss"] is None else "%.3f" % r["loss"]
print("%.3f|%d|%d|%s|%.1f" % (r["mean_compute_share"], r["rounds"], tokens, loss, r["bytes_per_sample"] / 64))
' "$json")
        IFS='|' read -r share rounds tokens loss bytes <<<"$row"
        echo "| $name | $h | $share | $rounds | $tokens | $loss | $bytes |"
    done
done
