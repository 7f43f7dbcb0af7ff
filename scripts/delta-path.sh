#!/usr/bin/env bash
# The whole way of each streamed Codex delta on both sides of the `codex_daemon` bench, from
# one system-wide trace: the mock's write of a chunk -> Codex's read of it -> (host side)
# Codex's stdout write of the line -> the host's read of it -> the host's write to the 1st and
# to the 10th follower -> the bench's read on the last follower's socket; (daemon side)
# Codex's read of the chunk -> its writes to the 1st and 10th follower -> the last follower's
# read. For each stretch it prints p50 / p90 / p99 / max in microseconds over all deltas,
# and its mean over the slowest 5 % (by the mock's write -> the last follower's read), so
# that a tail can be put on one stretch. It says how many of the mock's writes it could
# follow the whole way, and why it dropped the others.
#
# It records a few system calls (read, write, sendto, sendmsg, recvfrom) and the scheduler's
# switch and wake-up events on every CPU (`perf record -a`), which slows every process a
# little: read the bench's own figures of such a run as traced. The script does not analyse
# the scheduler's events; they are for reading one delta's way across the CPUs, wake-ups
# included, in `$OUT/perf.txt` (kept when OUT is set).
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
# On an early exit, stop the bench and everything it started under it (its host and Codex).
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
trap '[ -z "$runner" ] || kill_tree "$runner"; [ -n "$keep" ] || rm -rf "$out"' EXIT

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
    syscalls:sys_enter_read syscalls:sys_exit_read syscalls:sys_enter_recvfrom \
    syscalls:sys_exit_recvfrom sched:sched_switch sched:sched_wakeup; do
    events+=(-e "$e" --exclude-perf)
done
perf record -q -a -o "$out/perf.data" "${events[@]}" -- sleep "$secs" 2>"$out/perf.err" ||
    { cat "$out/perf.err" >&2; echo "perf record failed" >&2; exit 1; }
wait "$runner" || true
runner=""
perf script -i "$out/perf.data" -F comm,pid,tid,cpu,time,event,trace >"$out/perf.txt" 2>"$out/perf.err" ||
    { cat "$out/perf.err" >&2; echo "perf script failed" >&2; exit 1; }

python3 - "$out/perf.txt" "$bench_pid" "$host" "$hcodex" "$daemon" <<'PY'
import bisect, collections, re, sys
path, BENCH, HOST, HCODEX, DAEMON = sys.argv[1:6]
pat = re.compile(r'\s*(\S.*?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+\S+:(\S+):\s*(.*)')
ev = []
for line in open(path, errors='replace'):
    m = pat.match(line)
    if m and m.group(2) in (BENCH, HOST, HCODEX, DAEMON):
        # (time, pid, tid, event, arguments)
        ev.append((float(m.group(5)), m.group(2), m.group(3), m.group(6), m.group(7)))
ev.sort(key=lambda e: e[0])

def arg(e, name):
    m = re.search(name + r': (0x[0-9a-f]+)', e[4])
    return int(m.group(1), 16) if m else 0

def ret(e):
    m = re.search(r'(0x[0-9a-f]+)\s*$', e[4])
    v = int(m.group(1), 16) if m else -1
    return v - (1 << 64) if v >= 1 << 63 else v

# A read's exit event has no descriptor: take it from the same thread's entry.
fd_of = {}
entering = {}
for k, e in enumerate(ev):
    if e[3] in ('sys_enter_read', 'sys_enter_recvfrom'):
        entering[e[2]] = arg(e, 'fd')
    elif e[3] in ('sys_exit_read', 'sys_exit_recvfrom'):
        fd_of[k] = entering.pop(e[2], None)

def sent_fd(e):
    """The socket of a follower frame's write, or None. Both servers write sockets with
    `sendto` (a task) or `sendmsg` (the host's hub); a plain `write` is a file (a log), and
    an 8-byte `sendto` is not a frame."""
    if e[3] == 'sys_enter_sendmsg':
        return arg(e, 'fd')
    if e[3] == 'sys_enter_sendto' and arg(e, 'len') > 8:
        return arg(e, 'fd')
    return None

def data_read(e):
    return e[3] in ('sys_exit_read', 'sys_exit_recvfrom') and 8 < ret(e) < 65536

# The mock's chunk writes: the bench's sendto calls (its followers only read).
mock = [e[0] for e in ev if e[1] == BENCH and e[3] == 'sys_enter_sendto' and 100 < arg(e, 'len') < 400]
times = [e[0] for e in ev]
dropped = collections.Counter()

def leg(t_m):
    """One chunk's way from the mock's write: (side, stretch ends), or None with a reason."""
    i = bisect.bisect_right(times, t_m)
    nxt = bisect.bisect_right(mock, t_m)
    end = mock[nxt] if nxt < len(mock) else t_m + 0.05
    p = {'m': t_m}
    sends, reads, side, size = {}, {}, None, None
    for k in range(i, len(ev)):
        e = ev[k]
        if e[0] >= end or e[0] - t_m > 0.05:
            break
        if side is None:
            if e[1] in (HCODEX, DAEMON) and data_read(e):
                side = 'host' if e[1] == HCODEX else 'daemon'
                p['c'] = e[0]
            continue
        if side == 'host' and size is None:
            if e[1] == HCODEX and e[3] == 'sys_enter_write' and arg(e, 'fd') == 1:
                p['w'], size = e[0], arg(e, 'count')
                if not 180 <= size <= 260:
                    return None, 'host: Codex wrote no delta line first (a bracket)'
            continue
        if side == 'host' and 'r' not in p:
            if e[1] == HOST and e[3] == 'sys_exit_read' and ret(e) == size:
                p['r'] = e[0]
            continue
        sender = HOST if side == 'host' else DAEMON
        fd = sent_fd(e) if e[1] == sender else None
        if fd is not None and fd not in sends and len(sends) < 10:
            sends[fd] = e[0]
        elif sends and e[1] == BENCH and data_read(e) and fd_of.get(k) is not None:
            reads.setdefault(fd_of[k], e[0])
        if len(sends) == 10 and len(reads) >= 10:
            break
    if side is None:
        return None, 'no Codex read of the chunk before the next one'
    if side == 'host' and 'r' not in p:
        return None, 'host: no read of the whole line (joined with another, or none)'
    if len(sends) < 10 or len(reads) < 10:
        return None, f'{side}: fewer than 10 followers written and read before the next chunk'
    s, r = sorted(sends.values()), sorted(reads.values())
    p.update(s1=s[0], s10=s[9], k1=r[0], k10=r[9])
    return side, p

legs = {'host': [], 'daemon': []}
for t in mock:
    side, got = leg(t)
    if side:
        legs[side].append(got)
    else:
        dropped[got] += 1
print(f'{len(mock)} mock writes; followed the whole way: host side {len(legs["host"])}, '
      f'daemon side {len(legs["daemon"])}')
for why, n in dropped.most_common():
    print(f'  dropped {n}: {why}')

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
    print(f'{side}: {len(ls)} deltas (us); the slowest 5 % ({len(slow)}) apart')
    for name, a, b in stretches[side]:
        xs = [(p[b] - p[a]) * 1e6 for p in ls]
        ys = [(p[b] - p[a]) * 1e6 for p in slow]
        print(f'  {name:34s} p50 {pct(xs, .5):6.0f} p90 {pct(xs, .9):6.0f} p99 {pct(xs, .99):6.0f} '
              f'max {max(xs):6.0f} | slowest: mean {sum(ys) / len(ys):6.0f}')
PY
grep -a 'host all rounds\|^daemon all rounds' "$out/bench.log" | sed 's/; spread.*//' || true
