#!/usr/bin/env bash
# The whole way of each streamed Codex delta on both sides of the `codex_daemon` bench, from
# one system-wide trace: the mock's write of a chunk -> Codex's read of it -> (host side)
# Codex's stdout write of the line -> the host's read of it -> the host's 1st and 10th
# follower write -> the bench's last follower read; (daemon side) Codex's read of the chunk ->
# its 1st and 10th follower write -> the bench's last follower read. Printed as p50 / p90 /
# p99 / max of each stretch in microseconds, for all deltas and for the slowest 5 % (by the
# mock's write -> the last follower's read), so that a tail can be put on one stretch.
#
# It records a few system calls (read, write, sendto, sendmsg, recvfrom) and the scheduler's
# switch and wake-up events on every CPU (`perf record -a`), which slows every process a
# little: read the bench's own figures of such a run as traced. `perf script` of the trace
# (`$OUT/perf.txt`) shows any one delta's way across the CPUs, wake-ups included.
#
# Usage (as root, `perf` installed):
#   cargo bench --bench codex_daemon --no-run
#   scripts/delta-path.sh [seconds]
# Env: ARGS, the bench's arguments (default `1 4 93 30`); OUT, where the trace is kept
# (default a temporary directory, removed); AGENT_HOST_BENCH_TRANSPORT and the bench's other
# variables pass through.
set -euo pipefail

secs=${1:-40}
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 2; }
cd "$(dirname "$0")/.."
bench=$(ls -t target/release/deps/codex_daemon-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
[ -n "$bench" ] || { echo "build the bench first: cargo bench --bench codex_daemon --no-run" >&2; exit 2; }
keep=${OUT:-}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
runner=""
trap '[ -z "$runner" ] || kill "$runner" 2>/dev/null || true; [ -n "$keep" ] || rm -rf "$out"' EXIT

# shellcheck disable=SC2086
"$bench" ${ARGS:-1 4 93 30} --bench >"$out/bench.log" 2>&1 &
runner=$!
# The warm-up turns are over once the bench names the processes of both sides.
for _ in $(seq 1200); do
    grep -q '^daemon process' "$out/bench.log" 2>/dev/null && break
    kill -0 "$runner" 2>/dev/null || { cat "$out/bench.log" >&2; exit 1; }
    sleep 0.1
done
hcodex=$(sed -n 's/^host child \([0-9]*\):.*/\1/p' "$out/bench.log" | head -1)
daemon=$(sed -n 's/^daemon process \([0-9]*\):.*/\1/p' "$out/bench.log" | head -1)
[ -n "$hcodex" ] && [ -n "$daemon" ] || { echo "the bench did not name its processes" >&2; exit 1; }
host=$(awk '{print $4}' "/proc/$hcodex/stat")
bench_pid=$(awk '{print $4}' "/proc/$host/stat")

events=()
for e in syscalls:sys_enter_write syscalls:sys_enter_sendto syscalls:sys_enter_sendmsg \
    syscalls:sys_exit_read syscalls:sys_exit_recvfrom sched:sched_switch sched:sched_wakeup; do
    events+=(-e "$e" --exclude-perf)
done
perf record -q -a -o "$out/perf.data" "${events[@]}" -- sleep "$secs" 2>/dev/null
wait "$runner" || true
runner=""
perf script -i "$out/perf.data" -F comm,pid,tid,cpu,time,event,trace >"$out/perf.txt" 2>/dev/null

python3 - "$out/perf.txt" "$bench_pid" "$host" "$hcodex" "$daemon" <<'PY'
import bisect, re, sys
path, BENCH, HOST, HCODEX, DAEMON = sys.argv[1:6]
pat = re.compile(r'\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+\S+:(\S+):\s*(.*)')
ev = []
for line in open(path, errors='replace'):
    m = pat.match(line)
    if m and m.group(2) in (BENCH, HOST, HCODEX, DAEMON):
        ev.append((float(m.group(5)), m.group(2), m.group(6), m.group(7)))
ev.sort(key=lambda e: e[0])

def arg(e, name):
    m = re.search(name + r': (0x[0-9a-f]+)', e[3])
    return int(m.group(1), 16) if m else 0

def ret(e):
    m = re.search(r'(0x[0-9a-f]+)\s*$', e[3])
    v = int(m.group(1), 16) if m else -1
    return v - (1 << 64) if v >= 1 << 63 else v

def sent(e):  # a frame of more than an eventfd's 8 bytes
    if e[2] == 'sys_enter_sendmsg':
        return True
    if e[2] == 'sys_enter_sendto':
        return arg(e, 'len') > 8
    return e[2] == 'sys_enter_write' and arg(e, 'fd') > 2 and arg(e, 'count') > 8

def received(e):
    return e[2] in ('sys_exit_read', 'sys_exit_recvfrom') and 8 < ret(e) < 65536

# The mock's chunk writes: the bench's sendto calls (its followers only read).
mock = [e[0] for e in ev if e[1] == BENCH and e[2] == 'sys_enter_sendto' and 100 < arg(e, 'len') < 400]
times = [e[0] for e in ev]

def leg(t_m):
    """One chunk's way from the mock's write, or None if it does not go the whole way."""
    i = bisect.bisect_right(times, t_m)
    nxt = bisect.bisect_right(mock, t_m)
    end = mock[nxt] if nxt < len(mock) else float('inf')
    p = {'m': t_m}
    sends, reads, side = [], [], None
    for e in ev[i:]:
        if e[0] >= end or e[0] - t_m > 0.05:
            break
        if side is None:
            if e[1] in (HCODEX, DAEMON) and e[2] in ('sys_exit_recvfrom', 'sys_exit_read') and ret(e) > 0:
                side = 'host' if e[1] == HCODEX else 'daemon'
                p['c'] = e[0]
            continue
        if side == 'host' and 'w' not in p:
            if e[1] == HCODEX and e[2] == 'sys_enter_write' and arg(e, 'fd') == 1:
                p['w'], size = e[0], arg(e, 'count')
                if not 180 <= size <= 260:  # a delta line, not a bracket
                    return None
            continue
        if side == 'host' and 'r' not in p:
            if e[1] == HOST and e[2] == 'sys_exit_read' and ret(e) == size:
                p['r'] = e[0]
            continue
        sender = HOST if side == 'host' else DAEMON
        if e[1] == sender and sent(e) and len(sends) < 10:
            sends.append(e[0])
        elif sends and e[1] == BENCH and received(e):
            reads.append(e[0])
        if len(sends) == 10 and len(reads) >= 10:
            break
    if side is None or len(sends) < 10 or len(reads) < 10:
        return None
    p.update(s1=sends[0], s10=sends[9], k1=reads[0], k10=reads[9])
    return side, p

legs = {'host': [], 'daemon': []}
for t in mock:
    got = leg(t)
    if got:
        legs[got[0]].append(got[1])

def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

stretches = {
    'host': [('mock write -> Codex read', 'm', 'c'), ('Codex read -> its stdout write', 'c', 'w'),
             ('stdout write -> host read', 'w', 'r'), ('host read -> 1st follower write', 'r', 's1'),
             ('1st -> 10th follower write', 's1', 's10'), ('10th write -> last follower read', 's10', 'k10'),
             ('mock write -> 1st follower read', 'm', 'k1'), ('mock write -> last follower read', 'm', 'k10')],
    'daemon': [('mock write -> Codex read', 'm', 'c'), ('Codex read -> 1st follower write', 'c', 's1'),
               ('1st -> 10th follower write', 's1', 's10'), ('10th write -> last follower read', 's10', 'k10'),
               ('mock write -> 1st follower read', 'm', 'k1'), ('mock write -> last follower read', 'm', 'k10')],
}
for side, ls in legs.items():
    if not ls:
        print(f'{side}: no delta went the whole way in the trace')
        continue
    slow = sorted(ls, key=lambda p: p['k10'] - p['m'])[int(len(ls) * 0.95):]
    print(f'{side}: {len(ls)} deltas traced (us); the slowest 5 % ({len(slow)}) apart')
    for name, a, b in stretches[side]:
        xs = [(p[b] - p[a]) * 1e6 for p in ls]
        ys = [(p[b] - p[a]) * 1e6 for p in slow]
        print(f'  {name:34s} p50 {pct(xs, .5):6.0f} p90 {pct(xs, .9):6.0f} p99 {pct(xs, .99):6.0f} '
              f'max {max(xs):6.0f} | slowest: mean {sum(ys) / len(ys):6.0f}')
PY
grep -a 'host all rounds\|^daemon all rounds' "$out/bench.log" | sed 's/; spread.*//' || true
