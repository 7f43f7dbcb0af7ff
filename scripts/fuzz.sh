#!/usr/bin/env bash
# Fuzz one target (or `all`, one after another) for MINUTES minutes each, growing its corpus
# in fuzz/corpus/TARGET. Needs a nightly toolchain; installs cargo-fuzz when missing.
#   scripts/fuzz.sh envelope 10
#   scripts/fuzz.sh all 10
# Crashes land in fuzz/artifacts/TARGET/; `cargo test --test suite fuzz_corpus::` replays the corpus.
# Extra libFuzzer flags go in FUZZ_FLAGS, e.g. FUZZ_FLAGS="-jobs=2".
set -euo pipefail

usage() {
    echo "usage: $0 TARGET|all MINUTES" >&2
    echo "targets: $(targets | tr '\n' ' ')" >&2
    exit 2
}

cd "$(dirname "$0")/.."

targets() {
    ls fuzz/fuzz_targets | sed -n 's/\.rs$//p'
}

[[ $# -eq 2 ]] || usage
target=$1
minutes=$2
[[ $minutes =~ ^[0-9]+$ ]] || usage

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

run_one() {
    local name=$1
    [[ -f fuzz/fuzz_targets/$name.rs ]] || usage
    mkdir -p "fuzz/corpus/$name" "fuzz/artifacts/$name"
    local log
    log=$(mktemp)
    echo "== $name: ${minutes} min" >&2
    # cargo-fuzz's default build: optimized, with debug assertions and overflow checks (an
    # overflow is a finding) and AddressSanitizer. -max_len: larger than any recorded transcript; -timeout: an input that takes a second
    # is a hang. A crash stops the run (non-zero status) and is left in fuzz/artifacts.
    local status=0
    # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
    cargo +nightly fuzz run "$name" "fuzz/corpus/$name" -- \
        -max_total_time=$((minutes * 60)) \
        -max_len=65536 \
        -rss_limit_mb=2048 \
        -timeout=10 \
        -print_final_stats=1 \
        ${FUZZ_FLAGS:-} 2>&1 | tee "$log" || status=$?
    echo "== $name: final stats" >&2
    grep -E '^(#[0-9]+.*DONE|stat::)' "$log" >&2 || true
    rm -f "$log"
    return "$status"
}

if [[ $target == all ]]; then
    for name in $(targets); do
        run_one "$name"
    done
else
    run_one "$target"
fi
