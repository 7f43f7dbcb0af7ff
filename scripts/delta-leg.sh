#!/usr/bin/env bash
# The host's own leg of each streamed Codex delta, from a system-call trace: Codex's write of
# the line to its stdout -> the host's read of it -> the host's first and tenth follower
# `sendto` or `sendmsg`. No probes and no special build: it traces the host and its Codex child with
# `perf record -e raw_syscalls:*` during the `codex_daemon` bench (whose 10 followers are the
# ten writes), and prints p10 / p50 / p90 / p99 in microseconds. Tracing every system call
# slows the traced host (read the bench's own figures of such a run as traced, not as its
# speed); compare builds by running this for each in turn, A B A B.
#
# Usage (as root, `perf` installed):
#   cargo bench --bench codex_daemon --no-run
#   scripts/delta-leg.sh [agent-host binary] [seconds]
# Env: ARGS, the bench's arguments (default `1 6 93 30`: 1 round x 6 turns x 93 chunks, 30 ms
# apart; `1 25 93 3` has them 3 ms apart, so that the host never goes idle between them).
set -euo pipefail

front=$(realpath "${1:-target/release/agent-host}")
secs=${2:-25}
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 2; }
[ -x "$front" ] || { echo "no agent-host binary at $front" >&2; exit 2; }
cd "$(dirname "$0")/.."
# Followers over TCP, whose frames are `sendto`/`sendmsg` calls the trace picks out (the bench
# compares over the Unix socket unless told otherwise).
export AGENT_HOST_BENCH_TRANSPORT=${AGENT_HOST_BENCH_TRANSPORT:-tcp}
bench=$(ls -t target/release/deps/codex_daemon-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
[ -n "$bench" ] || { echo "build the bench first: cargo bench --bench codex_daemon --no-run" >&2; exit 2; }
work=$(mktemp -d)
runner=""
trap '[ -z "$runner" ] || kill "$runner" 2>/dev/null || true; rm -rf "$work"' EXIT

# shellcheck disable=SC2086
AGENT_HOST_BENCH_HOST="$front" "$bench" ${ARGS:-1 6 93 30} --bench >"$work/bench.log" 2>&1 &
runner=$!
# `pid` descends from the bench (which re-runs itself in its own network namespace).
from_bench() {
    local pid=$1
    while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
        [ "$pid" = "$runner" ] && return 0
        pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null || true)
    done
    return 1
}
# The bench's host, once it has its Codex child; not any other host on this machine.
host=""
codex=""
for _ in $(seq 600); do
    for pid in $(pgrep -f '"command":"host.start"' || true); do
        if from_bench "$pid"; then
            host=$pid
            codex=$(pgrep -P "$host" | head -1 || true)
        fi
    done
    [ -n "$codex" ] && break
    sleep 0.05
done
[ -n "$codex" ] || { echo "the bench's host and its Codex did not start within 30 s" >&2; exit 1; }
# Let Codex start its threads (its stdout writer among them) before attaching to them.
sleep 2
perf record -q -o "$work/perf.data" -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit \
    -p "$host,$codex" -- sleep "$secs" 2>/dev/null
wait "$runner" || true
perf script -i "$work/perf.data" -F comm,pid,tid,cpu,time,event,trace 2>/dev/null |
    sed -E 's/ ([0-9]+)\/([0-9]+) / \1 \2 /' >"$work/perf.txt"

python3 - "$work/perf.txt" "$host" <<'PY'
import re, sys
host = sys.argv[2]
events = []
for line in open(sys.argv[1]):
    m = re.match(r'\s*(\S.*?)\s+(\d+)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)', line)
    if m:
        events.append((m.group(1), m.group(2), float(m.group(5)), m.group(6), m.group(7)))
legs = []
for i, e in enumerate(events):
    # Codex's stdout thread writing one delta line (~222 bytes) to fd 1.
    if not (e[0].startswith('app-server-stdo') and e[3] == 'raw_syscalls:sys_exit'
            and re.match(r'NR 1 = 2[0-5]\d$', e[4])):
        continue
    size = e[4].split('= ')[1]
    t0, read, first_syscall, sends = e[2], None, None, []
    for f in events[i + 1:i + 600]:
        if f[1] != host:
            continue
        if read is None:
            if f[3] == 'raw_syscalls:sys_exit' and f[4] == 'NR 0 = ' + size:
                read = f[2]
            continue
        if first_syscall is None and f[3] == 'raw_syscalls:sys_enter':
            first_syscall = f[2]
        # A follower's frame: `sendto` (44) from its connection's task, `sendmsg` (46) from
        # the hub's direct lane.
        if f[3] == 'raw_syscalls:sys_enter' and (f[4].startswith('NR 44 ')
                                                 or f[4].startswith('NR 46 ')):
            sends.append(f[2])
            if len(sends) == 10:
                break
    if read is not None and len(sends) == 10:
        legs.append(((read - t0) * 1e6, (first_syscall - read) * 1e6, (sends[0] - read) * 1e6,
                     (sends[-1] - read) * 1e6, (sends[-1] - t0) * 1e6))
if not legs:
    sys.exit('no delta went the whole way in the trace')
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]
print(f'{len(legs)} deltas traced (us)')
names = ['Codex write -> host read', 'host read -> its next syscall', 'host read -> 1st send',
         'host read -> 10th send', 'Codex write -> 10th send']
for k, name in enumerate(names):
    xs = [leg[k] for leg in legs]
    print(f'  {name:30s} p10 {pct(xs, .1):5.0f}  p50 {pct(xs, .5):5.0f}  '
          f'p90 {pct(xs, .9):5.0f}  p99 {pct(xs, .99):6.0f}')
PY
grep -a 'host all rounds\|^daemon all rounds' "$work/bench.log" | sed 's/; spread.*//' || true
