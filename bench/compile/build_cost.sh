#!/usr/bin/env bash
# bench/compile/build_cost.sh: what fusebox costs at the user's build (issue 22). Compiles each
# translation unit below REPS times (default 3), the units alternated within each repetition so
# that the machine's drift falls on all alike, and prints per unit the median CPU-seconds (user +
# sys of the compiler) and the median peak memory, then the ratios the issue's targets are about:
#
#   include_all          #include <fusebox/fusebox.hpp> and an empty main
#   include_<entry>      each smaller entry header (fusebox/<entry>.hpp) and an empty main
#   two_models_fusebox   bench/compile/two_models_fusebox.cpp: an MLP and a layer_norm(softmax) block,
#                        each compiled, explained and A/B'd, from <fusebox/cpu.hpp>
#   two_models_umbrella  the same from <fusebox/fusebox.hpp>
#   two_models_eigen     bench/compile/two_models_eigen.cpp: the same work with Eigen 3.4 (the peer)
#   quickstart           examples/quickstart.cpp
#   grad_block           bench/compile/grad_block.cpp: an attention block's gradient, eager and compiled
#   grad_block_wall      the same with -Wall (GCC's -Wsequence-point was superlinear in such programs)
#   <unit>_separate      include_all, include_cpu, two_models_fusebox, two_models_umbrella, quickstart, grad_block_wall with
#                        FUSEBOX_EXTERN_RUNTIME:
#                        the shape-independent code is in the implementation unit (core/linkage.hpp)
#   runtime              that implementation unit (fusebox_add_runtime()'s source), compiled once a program
#   pch_cpu              <fusebox/cpu.hpp> made into a precompiled header (fusebox_precompile_headers()),
#                        once a program and configuration
#   <unit>_pch           include_cpu, two_models_fusebox, two_models_fusebox_separate reading it
#                        (-include, -Werror=invalid-pch: a header GCC rejects fails the unit); the
#                        _separate one reads pch_cpu_separate's, made with FUSEBOX_EXTERN_RUNTIME
#
# Usage: bench/compile/build_cost.sh [REPS] [unit ...]   (default: all units)
# Environment: CXX (g++), CXXFLAGS (default -std=c++20 -O2 -march=native, the issue's), CPPFLAGS
# (extra -I), BUILD_COST_OUT (JSON lines; default build-cost/results.jsonl), BUILD_COST_OLD (an
# older tree's include/ directory: every fusebox unit is also built against it, as "<unit>@old",
# alternated with this tree's in each repetition, for before/after figures from one run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
reps="${1:-3}"
[ $# -gt 0 ] && shift
cxx="${CXX:-g++}"
flags="${CXXFLAGS:--std=c++20 -O2 -march=native}"
out="${BUILD_COST_OUT:-$root/build-cost/results.jsonl}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
: > "$out"

# unit name -> source file
declare -A src
printf '#include <fusebox/fusebox.hpp>\nint main() {}\n' > "$tmp/include_all.cpp"
src[include_all]="$tmp/include_all.cpp"
for entry in core cpu jit cuda train data; do  # the entry headers the README lists
  if [ -f "$root/include/fusebox/$entry.hpp" ]; then
    printf '#include <fusebox/%s.hpp>\nint main() {}\n' "$entry" > "$tmp/include_$entry.cpp"
    src[include_$entry]="$tmp/include_$entry.cpp"
  fi
done
src[two_models_fusebox]="$root/bench/compile/two_models_fusebox.cpp"
src[two_models_umbrella]="$root/bench/compile/two_models_fusebox.cpp"
# unit name -> its own extra compiler arguments
declare -A defs=([two_models_umbrella]=-DFUSEBOX_TWO_MODELS_UMBRELLA)
# unit name -> its output when not an object file; unit name -> the precompiled header it reads
declare -A out needs_pch
[ -f /usr/include/eigen3/Eigen/Dense ] && src[two_models_eigen]="$root/bench/compile/two_models_eigen.cpp"
src[quickstart]="$root/examples/quickstart.cpp"
src[grad_block]="$root/bench/compile/grad_block.cpp"
src[grad_block_wall]="$root/bench/compile/grad_block.cpp"
defs[grad_block_wall]=-Wall
for u in include_all include_cpu two_models_fusebox two_models_umbrella quickstart grad_block_wall; do
  src[${u}_separate]="${src[$u]}"
  defs[${u}_separate]="${defs[$u]:-} -DFUSEBOX_EXTERN_RUNTIME"
done
printf '#include <fusebox/fusebox.hpp>\n#include <fusebox/train.hpp>\n#include <fusebox/data.hpp>\n' > "$tmp/runtime.cpp"
src[runtime]="$tmp/runtime.cpp"
defs[runtime]="-DFUSEBOX_EXTERN_RUNTIME -DFUSEBOX_IMPLEMENTATION"

# Precompiled <fusebox/cpu.hpp>: one header per set of definitions, as CMake's REUSE_FROM shares it.
mkdir -p "$tmp/pch"
for v in "" _separate; do
  printf '#include <fusebox/cpu.hpp>\n' > "$tmp/pch/cpu$v.hpp"
  src[pch_cpu$v]="$tmp/pch/cpu$v.hpp"
  out[pch_cpu$v]="$tmp/pch/cpu$v.hpp.gch"
done
defs[pch_cpu]="-x c++-header"
defs[pch_cpu_separate]="-x c++-header -DFUSEBOX_EXTERN_RUNTIME"
for u in include_cpu two_models_fusebox two_models_fusebox_separate; do
  v=""; [[ "$u" == *_separate ]] && v=_separate
  src[${u}_pch]="${src[$u]}"
  defs[${u}_pch]="${defs[$u]:-} -include $tmp/pch/cpu$v.hpp -Werror=invalid-pch"
  needs_pch[${u}_pch]=pch_cpu$v
done

units=("$@")
if [ ${#units[@]} -eq 0 ]; then
  units=(include_all)
  for entry in core cpu jit cuda train data; do [ -n "${src[include_$entry]:-}" ] && units+=("include_$entry"); done
  units+=(two_models_fusebox two_models_umbrella)
  [ -n "${src[two_models_eigen]:-}" ] && units+=(two_models_eigen)
  units+=(quickstart grad_block grad_block_wall include_all_separate include_cpu_separate two_models_fusebox_separate quickstart_separate
          grad_block_wall_separate runtime pch_cpu include_cpu_pch two_models_fusebox_pch pch_cpu_separate
          two_models_fusebox_separate_pch)
fi

echo "# build cost: $cxx $flags, $reps repetition(s), $(nproc) CPU(s), $(date -u '+%Y-%m-%d %H:%M UTC')"
old="${BUILD_COST_OLD:-}"
for r in $(seq 1 "$reps"); do
  for u in "${units[@]}"; do
    s="${src[$u]:?unknown unit $u}"
    p="${needs_pch[$u]:-}"
    if [ -n "$p" ] && [ ! -f "${out[$p]}" ]; then  # asked for without its header: made, not timed
      # shellcheck disable=SC2086
      "$cxx" $flags -I"$root/include" ${CPPFLAGS:-} ${defs[$p]} "${src[$p]}" -o "${out[$p]}"
    fi
    trees=("$root/include")
    # The old tree first in odd repetitions, second in even ones.
    # Eigen's unit and entry headers the old tree lacks have no old build. An old tree without
    # <fusebox/cpu.hpp> builds the two-model program from fusebox.hpp (once, as two_models_fusebox@old).
    old_split=0; [ -n "$old" ] && [ -f "$old/fusebox/cpu.hpp" ] && old_split=1
    old_linkage=0; [ -n "$old" ] && [ -f "$old/fusebox/core/linkage.hpp" ] && old_linkage=1
    if [ -n "$old" ] && [ "$u" != two_models_eigen ] && [[ "$u" != pch_* && "$u" != *_pch ]] && { [ $old_linkage = 1 ] || [[ "$u" != *_separate && "$u" != runtime ]]; } && { [ $old_split = 1 ] || [ "$u" != two_models_umbrella ]; } &&
       { [[ "$u" != include_* ]] || [ "$u" = include_all ] || [ -f "$old/fusebox/${u#include_}.hpp" ]; }; then
      if [ $((r % 2)) = 1 ]; then trees=("$old" "$root/include"); else trees+=("$old"); fi
    fi
    for inc in "${trees[@]}"; do
      name="$u"; extra="${defs[$u]:-}"
      if [ "$inc" = "$old" ]; then
        name="$u@old"
        [ $old_split = 0 ] && [ "$u" = two_models_fusebox ] && extra=-DFUSEBOX_TWO_MODELS_UMBRELLA
      fi
      # shellcheck disable=SC2086  # the flags are meant to split
      if ! /usr/bin/time -o "$tmp/time" -f "%U %S %M" "$cxx" $flags -I"$inc" -I/usr/include/eigen3 \
          ${CPPFLAGS:-} $extra -c "$s" -o "${out[$u]:-$tmp/$u.o}" 2> "$tmp/err"; then
        echo "# $name: build failed:"; head -20 "$tmp/err"; exit 1
      fi
      read -r user sys kb < "$tmp/time"
      awk -v u="$name" -v r="$r" -v c="$user" -v s="$sys" -v k="$kb" \
        'BEGIN { printf "{\"unit\":\"%s\",\"rep\":%d,\"cpu_s\":%.2f,\"peak_mb\":%.0f}\n", u, r, c + s, k / 1024 }' >> "$out"
    done
  done
  echo "# repetition $r done (load average: $(uptime | sed 's/.*load average: *//'))"
done

python3 - "$out" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["unit"], []).append(r)
med = {u: (statistics.median(x["cpu_s"] for x in rs), statistics.median(x["peak_mb"] for x in rs)) for u, rs in runs.items()}
print(f"{'unit':<22} {'CPU-s (median)':>15} {'peak MB':>8}   runs (CPU-s)")
for u, rs in runs.items():
    print(f"{u:<22} {med[u][0]:>15.2f} {med[u][1]:>8.0f}   " + ", ".join(f"{x['cpu_s']:.2f}" for x in rs))
for u in med:
    if u.endswith("@old") and u[:-4] in med:
        print(f"{u[:-4]}: new / old {med[u[:-4]][0] / med[u][0]:.2f}x CPU-s, {med[u[:-4]][1] / med[u][1]:.2f}x peak")
if "two_models_fusebox" in med and "two_models_eigen" in med:
    f, e = med["two_models_fusebox"], med["two_models_eigen"]
    print(f"two models, fusebox (cpu.hpp) / Eigen: {f[0] / e[0]:.2f}x CPU-s (target <= 2), {f[1] / e[1]:.2f}x peak (target <= 1.5)")
    if "two_models_fusebox_separate" in med:
        g = med["two_models_fusebox_separate"]
        print(f"two models, fusebox (cpu.hpp, FUSEBOX_EXTERN_RUNTIME) / Eigen: {g[0] / e[0]:.2f}x CPU-s, {g[1] / e[1]:.2f}x peak")
    if "two_models_umbrella" in med:
        g = med["two_models_umbrella"]
        print(f"two models, fusebox (fusebox.hpp) / Eigen: {g[0] / e[0]:.2f}x CPU-s, {g[1] / e[1]:.2f}x peak")
    for u, how in (("two_models_fusebox_pch", "cpu.hpp precompiled"),
                   ("two_models_fusebox_separate_pch", "cpu.hpp precompiled, FUSEBOX_EXTERN_RUNTIME")):
        if u in med:
            g = med[u]
            print(f"two models, fusebox ({how}) / Eigen: {g[0] / e[0]:.2f}x CPU-s, {g[1] / e[1]:.2f}x peak")
EOF
