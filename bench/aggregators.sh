#!/usr/bin/env bash
# What each aggregation rule costs an honest run, in virtual time: N honest workers (no
# attacker), the default MLP, exact f32 on the wire, ROUNDS rounds (2000), no plateau stop,
# for each RULE against `mean` on the same seeds. Prints a markdown table: the mean test
# accuracy and loss of the evaluations from round LATE (1500) on, averaged over SEEDS, and
# the points each rule loses against the mean. docs/BENCHMARKS.md ("What the default costs
# an honest run") has its output.
#
#   cargo build --release -p bench --bin sim && bench/aggregators.sh
#   WORKERS="5 9" SEEDS="1" RULES="centered-clip trimmed-mean" bench/aggregators.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIM=${SIM:-${CARGO_TARGET_DIR:-target}/release/sim}
WORKERS=${WORKERS:-"3 4 5 6 7 8 9"}
SEEDS=${SEEDS:-"1 2 3"}
RULES=${RULES:-"centered-clip mean-around-median"}
ROUNDS=${ROUNDS:-2000}
LATE=${LATE:-1500}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Two runs at a time: one per core of a 2-core machine.
for n in $WORKERS; do for seed in $SEEDS; do for rule in mean $RULES; do
    echo "$n $rule $seed"
done; done; done | xargs -P "${JOBS:-2}" -n 3 sh -c '
    "$0" --workers "$3" --max-rounds "$1" --compression none --seed "$5" \
        --coordinator "--aggregator $4 --patience 0" 2>/dev/null | tail -1 >"$2/$3-$4-$5.json"
' "$SIM" "$ROUNDS" "$out"
python3 - "$out" "$LATE" "$WORKERS" "$RULES" <<'EOF'
import json, os, sys
out, late, workers, rules = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def late_mean(n, rule):
    accs, losses = [], []
    for name in os.listdir(out):
        if not name.startswith(f"{n}-{rule}-") or not name[len(f"{n}-{rule}-"):-5].isdigit():
            continue
        curve = [e for e in json.load(open(os.path.join(out, name)))["curve"] if e["round"] >= late]
        accs.append(sum(e["accuracy"] for e in curve) / len(curve))
        losses.append(sum(e["loss"] for e in curve) / len(curve))
    return (sum(accs) / len(accs), sum(losses) / len(losses), len(accs)) if accs else None
head = "| workers | mean |" + "".join(f" {r} | vs mean |" for r in rules)
print(head)
print("|---" * (2 + 2 * len(rules)) + "|")
for n in workers:
    base = late_mean(n, "mean")
    if base is None:
        continue
    row = f"| {n} | {100 * base[0]:.2f} % / {base[1]:.3f} |"
    for r in rules:
        got = late_mean(n, r)
        row += " – | – |" if got is None else \
            f" {100 * got[0]:.2f} % / {got[1]:.3f} | {100 * (got[0] - base[0]):+.2f} |"
    print(row)
print(f"\naccuracy / test loss: the mean of the evaluations from round {late} of {os.environ.get('ROUNDS', 2000)}, over seeds {os.environ.get('SEEDS', '1 2 3')}")
EOF
