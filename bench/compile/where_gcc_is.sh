#!/usr/bin/env bash
# bench/compile/where_gcc_is.sh: which source lines a g++ compile spends its time on. GCC 12 has no
# -ftime-trace, and -ftime-report says which pass, not which template. This samples the compiler
# (cc1plus) with gdb while it runs and prints, for each sample, the file:line that GCC's
# `input_location` holds (during template instantiation: the statement being instantiated), then
# a count per line. Debian's cc1plus is stripped, but `input_location` and `expand_location` are
# exported for plugins. How issue 22 found that std::get<I> on a long std::tuple cost most of a
# gradient unit under -Wall (docs/benchmarks.md, run AH). A diagnostic, not a build step: the
# compile it samples may fail (rarely; it says so).
#
# Usage: bench/compile/where_gcc_is.sh [-n SAMPLES] [-i SECONDS] -- g++ ARGS...
#   (default 40 samples, 0.5 s apart, from 1 s after the start; needs gdb)
set -euo pipefail
samples=40 interval=0.5
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case "$1" in
    -n) samples="$2"; shift 2 ;;
    -i) interval="$2"; shift 2 ;;
    *) echo "usage: $0 [-n SAMPLES] [-i SECONDS] -- g++ ARGS..." >&2; exit 2 ;;
  esac
done
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "usage: $0 [-n SAMPLES] [-i SECONDS] -- g++ ARGS..." >&2; exit 2; }
command -v gdb > /dev/null || { echo "$0: needs gdb" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# expand_location returns a 32-byte struct: through a hidden pointer (first argument) on x86-64.
# The buffer is stack memory far below the stack pointer, not malloc's: the sample may stop the
# compiler inside malloc, and calling malloc then corrupts its heap (GCC crashed that way). A call
# that faults (the line table caught mid-update) is unwound, not delivered to the compiler.
cat > "$tmp/sample.gdb" <<'EOF'
set pagination off
set confirm off
set unwindonsignal on
set $buf = (char*)($sp - 65536)
call ((void(*)(void*,unsigned))_Z15expand_locationj)($buf, *(unsigned*)&input_location)
printf "SAMPLE %s:%d\n", *(char**)$buf, *(int*)($buf+8)
detach
quit
EOF

"$@" &
driver=$!
sleep 1
for _ in $(seq "$samples"); do
  pid="$(pgrep -n -P "$driver" cc1plus || true)"
  [ -n "$pid" ] || break
  gdb -p "$pid" -batch -x "$tmp/sample.gdb" 2> /dev/null | sed -n 's/^SAMPLE //p' >> "$tmp/samples" || true
  sleep "$interval"
done
status=0
wait "$driver" || status=$?
# An inferior call at an arbitrary point is not safe in every state: use the figures, not the
# object file, of a sampled compile.
[ "$status" = 0 ] || echo "# the compile failed (exit $status): its errors are above; a sample can crash it"
[ -s "$tmp/samples" ] || { echo "$0: no samples (the compile ended first, or gdb could not attach)"; exit 1; }
echo "# $(wc -l < "$tmp/samples") samples; the lines GCC was at, most often first"
sort "$tmp/samples" | uniq -c | sort -rn | head -25
