#!/usr/bin/env bash
# The local-steps sweep, in virtual time: H ∈ {1, 4, 16, 64, auto} × links {loopback,
# 50 ms / 10 Mbit/s, 150 ms / 5 Mbit/s, 50 ms / 10 Mbit/s with workers of mixed speeds}, 4
# workers, the default MLP, to 95 % test accuracy. Prints a markdown table: time to target,
# the workers' mean compute share, bytes per sample. docs/BENCHMARKS.md ("Local steps")
# has its output.
#
#   cargo build --release -p bench && bench/sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIM=${SIM:-${CARGO_TARGET_DIR:-target}/release/sim}
TARGET=${TARGET:-0.95}
echo "| link | H | time to $TARGET (virtual s) | vs H = 1 | compute share | bytes per sample | updates |"
echo "|---|---|---|---|---|---|---|"
for link in "loopback|--link 0/0" "50 ms, 10 Mbit/s|--link 50ms/10" "150 ms, 5 Mbit/s|--link 150ms/5" \
    "50 ms, 10 Mbit/s, speeds 1:1:2:4|--link 50ms/10 --slower 1,1,2,4"; do
    name=${link%%|*}
    flags=${link#*|}
    base=""
    for h in 1 4 16 64 auto; do
        case $h in 1) every=10 ;; 4) every=4 ;; 16) every=2 ;; *) every=1 ;; esac
        # shellcheck disable=SC2086
        json=$("$SIM" --workers 4 $flags --target-accuracy "$TARGET" --max-time 3600s \
            --coordinator "--local-steps $h --eval-interval $every" | tail -1)
        row=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1]); base = sys.argv[2]
t = r["seconds_to_target"]
vs = "" if t is None or base in ("", "–") else "%.1f×" % (float(base) / t)
print("%s|%s|%.3f|%.1f|%d" % ("–" if t is None else "%.1f" % t, vs, r["mean_compute_share"], r["bytes_per_sample"], r["rounds"]))
' "$json" "$base")
        IFS='|' read -r t vs share bytes rounds <<<"$row"
        [ "$h" = 1 ] && base=$t
        echo "| $name | $h | $t | $vs | $share | $bytes | $rounds |"
    done
done
