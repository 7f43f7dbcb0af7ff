#!/usr/bin/env bash
# Where one Codex text delta spends its time inside the host, stage by stage: from the host's
# read of Codex's stdout to its first WebSocket write to a follower.
#
# It runs the `codex_daemon` bench with the host given, puts uprobes (perf probe) on the
# entry of the functions each delta passes through, records them with every syscall of the
# host for a few seconds of the first round, and prints the median time spent before each
# stage is reached (microseconds; each probe adds a few of its own).
#
# Usage (as root, `perf` installed):
#   CARGO_TARGET_DIR=/tmp/fp-target RUSTFLAGS="-C force-frame-pointers=yes" \
#     cargo build --release --bins
#   cargo bench --bench codex_daemon --no-run
#   scripts/delta-stages.sh /tmp/fp-target/release/agent-host [seconds] [bench args...]
# The bench args default to `1 4 93 30` (1 round x 4 turns x 93 chunks, 30 ms apart).
set -euo pipefail

front=${1:?usage: delta-stages.sh <agent-host binary> [seconds] [bench args...]}
secs=${2:-8}
shift 2 2>/dev/null || shift $#
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(1 4 93 30)
full="$(dirname "$front")/agent-hostd"
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 2; }
[ -x "$full" ] || { echo "no agent-hostd beside $front" >&2; exit 2; }
cd "$(dirname "$0")/.."
# Followers over TCP, whose frames are `sendto`/`sendmsg` calls the trace picks out (the bench
# compares over the Unix socket unless told otherwise).
export AGENT_HOST_BENCH_TRANSPORT=${AGENT_HOST_BENCH_TRANSPORT:-tcp}
bench=$(ls target/release/deps/codex_daemon-* 2>/dev/null | grep -v '\.d$' | head -1)
[ -n "$bench" ] || { echo "build the bench first: cargo bench --bench codex_daemon --no-run" >&2; exit 2; }
work=$(mktemp -d)
trap 'perf probe -q -d "probe_agent:*" 2>/dev/null || true; rm -rf "$work"' EXIT

# One probe per function (every monomorphised copy), at its entry. `perf probe` takes the
# address as an offset into the file's text, one page below `nm`'s address.
perf probe -q -d 'probe_agent:*' 2>/dev/null || true
probe() {
    local name=$1 pattern=$2 n=0 addr
    for addr in $(nm "$full" | grep -E ' [tT] ' | grep -E "$pattern" | awk '{print $1}'); do
        n=$((n + 1))
        perf probe -q -x "$full" -a "$name$n=$(printf '0x%x' $((0x$addr - 0x1000)))"
    done
    [ $n -gt 0 ] || { echo "no symbol matches $pattern in $full" >&2; exit 2; }
}
probe route '7jsonrpc5route28'                          # a line read, parsed, routed
probe drvinc 'codex_process6Driver11on_incoming28'      # the driver takes it
probe onnotif '5codex10Translator15on_notification17'   # translated
probe onout 'Actor\$GT\$9on_output28'                   # the session actor takes the event
probe pub '3bus3Bus7publish28'                          # published
probe hub '3bus3hub3run28'                              # the hub polls
probe offer 'hub4Slot17offer_block_delta'               # offered to each subscriber
probe serve '4link5serve28'                             # a follower's connection task polls
probe hassess 'access6Access11has_session'              # it checks the scope
probe pushmsg 'bus8Delivery12push_message'              # it takes the frame

AGENT_HOST_BENCH_HOST="$front" "$bench" "${args[@]}" --bench >"$work/bench.log" 2>&1 &
runner=$!
host=""
for _ in $(seq 300); do
    host=$(pgrep -f 'agent-host \{"command":"host.start"' | head -1 || true)
    [ -n "$host" ] && [ -n "$(pgrep -P "$host" | head -1 || true)" ] && break
    sleep 0.1
done
[ -n "$host" ] || { echo "the host did not start" >&2; exit 1; }
sleep 2
perf record -q -o "$work/perf.data" -e 'probe_agent:*' -e raw_syscalls:sys_enter \
    -e raw_syscalls:sys_exit -p "$host" -- sleep "$secs"
wait "$runner" || true
grep -a 'host all rounds\|^daemon all rounds' "$work/bench.log" || true
perf script -i "$work/perf.data" 2>/dev/null >"$work/perf.txt"

python3 - "$work/perf.txt" <<'EOF'
import re, sys
events = []
for line in open(sys.argv[1]):
    m = re.match(r'\s*(\S.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)', line)
    if m:
        events.append(m.groups())
order = ['route', 'drvinc', 'onnotif', 'onout', 'pub', 'hub', 'offer', 'serve', 'hassess',
         'pushmsg', 'send']
stages = {k: [] for k in order}
totals = []
# A delta line of Codex is one read of 200-260 bytes; a bracket's way includes its commit.
reads = [i for i, e in enumerate(events)
         if e[4] == 'raw_syscalls:sys_exit' and re.search(r'NR 0 = 2[0-5]\d\b', e[5])]
for i in reads:
    t0 = float(events[i][3])
    seen = {}
    for e in events[i + 1:i + 300]:
        if e[4].startswith('probe_agent:'):
            seen.setdefault(re.sub(r'\d+$', '', e[4].split(':')[1]), float(e[3]))
        elif e[4] == 'raw_syscalls:sys_enter' and e[5].startswith('NR 44 '):
            seen['send'] = float(e[3])  # sendto: the first follower's frame
            break
    if len(seen) < len(order):
        continue
    prev = t0
    for k in order:
        stages[k].append((seen[k] - prev) * 1e6)
        prev = seen[k]
    totals.append((seen['send'] - t0) * 1e6)
if not totals:
    sys.exit('no delta went the whole way in the recording')
med = lambda xs: sorted(xs)[len(xs) // 2]
print(f'{len(totals)} deltas: stdout read -> first follower write, median {med(totals):.0f} us')
print('median us before each stage: ' + ' '.join(f'{k} {med(v):.0f}' for k, v in stages.items()))
EOF
