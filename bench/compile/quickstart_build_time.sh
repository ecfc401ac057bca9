#!/usr/bin/env bash
# bench/compile/quickstart_build_time.sh: the build time of the quickstart translation unit, a
# compile-time figure (BENCHMARKS.md: compile time is a performance figure too). Times
#   $CXX -std=c++20 -O2 -march=native -I include -c examples/quickstart.cpp
# from the repository root, FUSEBOX_BENCH_BUILD_REPS times (default 3), and prints the median as
# one JSON line:
#   {"workload":"build_quickstart","system":"fusebox","mode":"compile_time","compile_s":...}
#
# Usage: quickstart_build_time.sh [repository root]   (default: two levels above this script)
# Environment: CXX (default g++), FUSEBOX_BENCH_EXTRA_FLAGS (appended to the command line),
# FUSEBOX_BENCH_BUILD_REPS.
set -euo pipefail

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
cxx="${CXX:-g++}"
reps="${FUSEBOX_BENCH_BUILD_REPS:-3}"
cd "$root"

src=examples/quickstart.cpp
if [ ! -f "$src" ]; then
  printf '{"workload":"build_quickstart","system":"fusebox","mode":"compile_time","threads":1,"note":"%s does not exist yet"}\n' "$src"
  exit 0
fi

# shellcheck disable=SC2206  # the extra flags are meant to split
cmd=("$cxx" -std=c++20 -O2 -march=native -I include ${FUSEBOX_BENCH_EXTRA_FLAGS:-} -c "$src")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

times=()
for _ in $(seq "$reps"); do
  t0="$(date +%s.%N)"
  if ! "${cmd[@]}" -o "$tmp/quickstart.o" 2>"$tmp/err"; then
    msg="$(head -c 300 "$tmp/err" | tr '\n"\\' '   ')"
    printf '{"workload":"build_quickstart","system":"fusebox","mode":"compile_time","threads":1,"note":"build failed: %s"}\n' "$msg"
    exit 0
  fi
  t1="$(date +%s.%N)"
  times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')")
done

median="$(printf '%s\n' "${times[@]}" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
version="$("$cxx" --version | head -n 1 | tr '"\\' '  ')"
note=""
if grep -qi placeholder "$src"; then note=',"note":"examples/quickstart.cpp is still a placeholder"'; fi
printf '{"workload":"build_quickstart","system":"fusebox","mode":"compile_time","threads":1,"compile_s":%s,"config":"%s; %s -o quickstart.o; median of %s builds (%s s)"%s}\n' \
  "$median" "$version" "${cmd[*]:1}" "$reps" "${times[*]}" "$note"
