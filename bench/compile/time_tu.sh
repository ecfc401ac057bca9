#!/bin/bash
# bench/compile/time_tu.sh: a compiler launcher that appends "user-s sys-s peak-KB object" of every
# compile to $FUSEBOX_TU_TIMES (default /tmp/tu_times.log). Per-unit build costs of the test suite:
#   cmake -S . -B build-time -DFUSEBOX_BUILD_TESTS=ON -DCMAKE_CXX_COMPILER_LAUNCHER=$PWD/bench/compile/time_tu.sh
#   cmake --build build-time -j2 && sort -rn /tmp/tu_times.log | head
obj=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && obj="$a"; prev="$a"; done
exec /usr/bin/time -a -o "${FUSEBOX_TU_TIMES:-/tmp/tu_times.log}" -f "%U %S %M $obj" "$@"
