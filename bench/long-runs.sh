#!/usr/bin/env bash
# The long runs: real tabs in headless Chromium training to a target over real sockets, and
# the 0.8M GPT's GPU tabs. Benchmarks, not tests: they take minutes each, so they are run by
# hand, and each prints its figures (the wall time to the target; docs/BENCHMARKS.md). The
# suite keeps a short form of each (the loss falls, nobody is struck).
#
#   bench/long-runs.sh              list them
#   bench/long-runs.sh NAME [NAME]  run these, one after the other
#   bench/long-runs.sh all          run every one
#
# They are the integration binary's `#[ignore]`d tests, built as the suite builds it.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A RUNS=(
    [cnn-tabs-98]="browser::two_tabs_train_the_cnn_to_98_percent"
    [gpt-tabs-2.0]="browser::two_tabs_train_a_gpt_to_a_validation_loss_of_2"
    [cnn-tabs-home-97.5]="links::two_tabs_behind_home_links_train_the_cnn_to_97_5_percent_with_local_steps"
    [gpt-tabs-home-2.0]="links::two_tabs_behind_home_links_train_a_gpt_to_a_validation_loss_of_2"
    [gpu-tabs-0.8m]="gpu_phases::two_gpu_tabs_behind_home_links_train_the_08m_gpt_checked_by_segments"
)

if [ $# -eq 0 ]; then
    for name in $(printf '%s\n' "${!RUNS[@]}" | sort); do
        printf '%-20s %s\n' "$name" "${RUNS[$name]}"
    done
    exit 0
fi
names=("$@")
if [ "$1" = all ]; then
    mapfile -t names < <(printf '%s\n' "${!RUNS[@]}" | sort)
fi
for name in "${names[@]}"; do
    if [ -z "${RUNS[$name]:-}" ]; then
        echo "no run named '$name'; bench/long-runs.sh lists them" >&2
        exit 2
    fi
done

source scripts/setup.sh
setup_wasm_tools
setup_chromium
build_web_pkg
export CHROMEDRIVER=/usr/bin/chromedriver
for name in "${names[@]}"; do
    say "$name (${RUNS[$name]})"
    start=$(date +%s)
    cargo test --locked -p server --test integration -- --ignored --exact --nocapture \
        "${RUNS[$name]}"
    say "$name took $(( $(date +%s) - start )) s"
done
