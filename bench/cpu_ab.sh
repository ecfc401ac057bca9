#!/usr/bin/env bash
# bench/cpu_ab.sh: "no regression" for the CPU workloads of make bench, old headers against new.
#
#   bench/cpu_ab.sh OLD_TREE [PAIRS] [-- cpu_workloads arguments]
#
# Builds bench/cpu_workloads.cpp (this tree's benchmark source) twice, against OLD_TREE/include and
# against this tree's include/, with the flags make bench uses (-O3 -DNDEBUG -march=native, no
# peers), then runs the two binaries alternately PAIRS times (default 4; old first in odd pairs,
# new first in even ones) with --systems=fusebox and the given arguments (default --threads=2).
# Prints every run's median per workload and, per workload, median(new) / median(old) over the
# runs. The machine's speed drifts, so only ratios of alternated runs in one invocation count.
#
# Environment: CXX (g++), CPPFLAGS (extra -I for xsimd/Boost.Hana, e.g. -I$PWD/.deps/usr/include),
# AB_DIR (where the binaries and JSON go; default build-ab/), AB_CALLS (instead of timing: each
# binary runs once under valgrind's callgrind with --calls=AB_CALLS, and the script prints each
# candidate's instructions per call, old and new. Instruction counts do not drift with the machine;
# they are not time either (alignment, cache and frequency effects are not in them). Use
# --threads=1: worker threads that spin make counts vary; pass --workloads to keep it short; the
# builds are -march=x86-64-v3, since valgrind decodes no AVX-512), AB_MARCH (-march for both
# builds; default native, or x86-64-v3 with AB_CALLS), AB_CODE (instead of timing: compare the two
# binaries' machine code function by function, at the ISA they were built for: objdump's
# instructions with addresses, RIP-relative offsets and alignment nops taken out, call and branch
# targets kept by name (without their offsets). Code that is the same runs the same, at any width,
# which neither timing on these machines (+-8%) nor valgrind (no AVX-512) can show to 3%; prints
# the functions that differ, largest first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
old="${1:?usage: bench/cpu_ab.sh OLD_TREE [PAIRS] [-- cpu_workloads arguments]}"
shift
pairs=4
if [ $# -gt 0 ] && [ "$1" != -- ]; then pairs="$1"; shift; fi
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--threads=2)
out="${AB_DIR:-$root/build-ab}"
mkdir -p "$out"
cxx="${CXX:-g++}"
# valgrind has no AVX-512: counted builds are AVX2 + FMA unless AB_MARCH says otherwise.
march="${AB_MARCH:-$([ -n "${AB_CALLS:-}" ] && echo x86-64-v3 || echo native)}"

build() {  # build NAME INCLUDE_DIR
  "$cxx" -std=c++20 -O3 -DNDEBUG -march="$march" ${CPPFLAGS:-} -I"$2" -I"$root/bench" \
    "$root/bench/cpu_workloads.cpp" -o "$out/cpu_workloads_$1" -lpthread -ldl
}
echo "# building old ($old/include) and new ($root/include) in parallel, -march=$march"
build old "$old/include" & pid_old=$!
build new "$root/include" & pid_new=$!
wait $pid_old && wait $pid_new

echo "# machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) CPU(s);" \
  "ISA flags: $(grep -o -w 'avx512f\|avx2\|asimd' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# pairs: $pairs; arguments: --systems=fusebox ${args[*]}"
: > "$out/ab.jsonl"
run() {  # run NAME PAIR (cpu_workloads appends to --out)
  : > "$out/run.jsonl"
  "$out/cpu_workloads_$1" --systems=fusebox "${args[@]}" --out="$out/run.jsonl" > /dev/null
  sed "s/^{/{\"tree\":\"$1\",\"pair\":$2,/" "$out/run.jsonl" >> "$out/ab.jsonl"
}
if [ -n "${AB_CODE:-}" ]; then
  python3 - "$out/cpu_workloads_old" "$out/cpu_workloads_new" <<'EOF'
import re, subprocess, sys
def functions(binary):
    """name -> normalised instruction list, from objdump -d (demangled)."""
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", binary], capture_output=True,
                          text=True, check=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            out[name] = []
            continue
        ins = re.match(r"^\s+[0-9a-f]+:\s+(.*)$", line)
        if name is None or not ins: continue
        i = re.sub(r"\s*#.*$", "", ins.group(1))                            # objdump's address comments
        if re.match(r"^((data16|cs|ds)\s+)*(nop|xchg %ax,%ax)", i): continue  # alignment padding
        i = re.sub(r"\b[0-9a-f]+ <([^>+]*)(\+0x[0-9a-f]+)?>", r"<\1>", i)  # branch targets by name
        i = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "X(%rip)", i)                   # where .rodata and .data landed
        out[name].append(re.sub(r"\s+", " ", i).strip())
    return out
old, new = functions(sys.argv[1]), functions(sys.argv[2])
common = sorted(set(old) & set(new))
same = [n for n in common if old[n] == new[n]]
differ = sorted((n for n in common if old[n] != new[n]), key=lambda n: -len(new[n]))
count = lambda names, side: sum(len(side[n]) for n in names)
print(f"# functions in both: {len(common)} ({count(common, new)} instructions in the new binary); "
      f"the same code: {len(same)} ({count(same, new)} instructions); different: {len(differ)} "
      f"({count(differ, new)} instructions)")
print(f"# only in old: {len(set(old) - set(new))} ({count(set(old) - set(new), old)} instructions); "
      f"only in new: {len(set(new) - set(old))} ({count(set(new) - set(old), new)} instructions)")
for n in differ:
    print(f"{len(old[n]):6d} -> {len(new[n]):6d} instructions  {n[:160]}")
EOF
  exit 0
fi
if [ -n "${AB_CALLS:-}" ]; then
  # Both at once (a count does not depend on what else runs); the program starts instrumentation
  # around its counted calls only, so the set-up runs uninstrumented.
  for t in old new; do
    rm -f "$out/callgrind.$t".*
    valgrind --tool=callgrind --instr-atstart=no --dump-instr=no --callgrind-out-file="$out/callgrind.$t.%p" \
      "$out/cpu_workloads_$t" --systems=fusebox --calls="$AB_CALLS" "${args[@]}" 2> "$out/callgrind.$t.log" \
      | grep '^# counted' | sed "s/^/$t /" &
  done
  wait
  # Each dump: "desc: Trigger: Client Request: <candidate>" and "summary: <instructions>".
  python3 - "$out" "$AB_CALLS" <<'EOF'
import glob, re, sys
out, calls = sys.argv[1], int(sys.argv[2])
ir = {"old": {}, "new": {}}
for t in ir:
    for f in glob.glob(f"{out}/callgrind.{t}.*"):
        if f.endswith(".log"): continue
        text = open(f).read()
        name = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if name and total: ir[t][name.group(1)] = int(total.group(1)) / calls
print(f"{'candidate':<72} {'old Ir/call':>14} {'new Ir/call':>14} new/old")
for name in sorted(set(ir["old"]) & set(ir["new"])):
    o, n = ir["old"][name], ir["new"][name]
    print(f"{name[:72]:<72} {o:14.0f} {n:14.0f} " + (f"{n / o:.4f}" if o else "(none counted)"))
EOF
  exit 0
fi
for p in $(seq 1 "$pairs"); do
  if [ $((p % 2)) = 1 ]; then run old "$p"; run new "$p"; else run new "$p"; run old "$p"; fi
  echo "# pair $p done (load average: $(uptime | sed 's/.*load average: *//'))"
done

# Per workload and thread count: each run's median, then median(new) / median(old).
python3 - "$out/ab.jsonl" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("system") != "fusebox" or "median_us" not in r: continue
    key = (r["workload"], r.get("mode", "") + (": " + r["config"][:40] if r.get("config") else ""), r["threads"])
    rows.setdefault(key, {"old": [], "new": []})[r["tree"]].append(r["median_us"])
print(f"{'workload':<12} {'mode (config)':<48} {'thr':>3}  {'old runs (us)':<30} {'new runs (us)':<30} new/old")
ratios = []
for (w, m, t), v in sorted(rows.items()):
    if not v["old"] or not v["new"]: continue
    q = statistics.median(v["new"]) / statistics.median(v["old"])
    ratios.append(q)
    fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    print(f"{w:<12} {m:<48} {t:>3}  {fmt(v['old']):<30} {fmt(v['new']):<30} {q:.3f}")
if ratios:
    print(f"geomean new/old: {statistics.geometric_mean(ratios):.3f} over {len(ratios)} configurations")
EOF
