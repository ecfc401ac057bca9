#!/usr/bin/env python3
"""bench/peers/merge_table.py: one table per workload from the JSON lines of several benchmarks.

Reads the JSON lines that fusebox's benchmarks and bench/peers/torch_reference.py print (one
object per line, fields as in shared BENCHMARKS.md: workload, system, mode, median_us, floor_us,
compile_s, warm_compile_s, max_rel_err, device, ...). Any other line is skipped, so whole stdout
logs can be given as they are. For every workload it prints each system+mode's median, the best
mode of each system, the floor and the compile times, then the ratio of the two systems' bests:

    speed-up = torch_best_us / fusebox_best_us      (> 1: fusebox is faster)

Records of system `limit` (copy bandwidth, matrix-product peak) are listed first. Where the same
workload/system/mode appears several times (several files or rounds), the median of the medians is
shown with the count n. A row whose max_rel_err is not finite or exceeds --max-err is marked `!`
and is not eligible as its system's best.

Usage (plain python3, no numpy):
    python3 bench/peers/merge_table.py fusebox_gpu.jsonl torch_gpu.jsonl
    python3 bench/peers/merge_table.py --a fusebox --b torch --workloads W3,W4 *.jsonl
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys

MODE_ORDER = [
    "eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs",
    "compiled", "jit", "reduce_overhead", "max_autotune",
]
SYSTEM_ORDER = ["fusebox", "torch", "libtorch", "eigen", "openblas"]

_BARE_NONFINITE = re.compile(r"(?<=[:\[,])\s*(-?inf(?:inity)?|nan)\s*(?=[,}\]])", re.IGNORECASE)


def parse_line(line: str):
    """One record from one line, or None. Tolerates bare nan/inf (C printf output)."""
    s = line.strip()
    if s.startswith("@@REC "):
        s = s[6:]
    if not s.startswith("{"):
        return None
    try:
        r = json.loads(s)
    except ValueError:
        def fix(m):
            t = m.group(1).lower()
            return " NaN" if t == "nan" else (" -Infinity" if t.startswith("-") else " Infinity")
        try:
            r = json.loads(_BARE_NONFINITE.sub(fix, s))
        except ValueError:
            return None
    if not isinstance(r, dict) or "workload" not in r or "system" not in r:
        return None
    return r


def read_records(paths):
    out = []
    for p in paths:
        f = sys.stdin if p == "-" else open(p, encoding="utf-8", errors="replace")
        try:
            for line in f:
                r = parse_line(line)
                if r is not None:
                    r["_file"] = p
                    out.append(r)
        finally:
            if f is not sys.stdin:
                f.close()
    return out


def natural_key(s: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(s)) if t]


def _order(value, order):
    return (order.index(value), "") if value in order else (len(order), str(value))


def num(r: dict, k: str):
    """A field as a float, or None where it is missing, null, not a number or negative (the C++
    harness writes negatives for 'does not apply')."""
    v = r.get(k)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    if not math.isfinite(v):  # a non-finite error is a failed check; any other non-finite field is missing
        return float("nan") if k == "max_rel_err" else None
    return v if v >= 0 else None


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def combine(recs):
    """Rows of one workload/system/mode (several rounds or files) folded into one."""
    meds = [num(r, "median_us") for r in recs]
    errs = [num(r, "max_rel_err") for r in recs]
    errs = [e for e in errs if e is not None]
    return {
        "median_us": _median(meds),
        "n": sum(1 for m in meds if m is not None),
        "floor_us": _median([num(r, "floor_us") for r in recs]),
        "compile_s": _median([num(r, "compile_s") for r in recs]),
        "warm_compile_s": _median([num(r, "warm_compile_s") for r in recs]),
        "max_rel_err": (float("nan") if any(math.isnan(e) for e in errs) else max(errs)) if errs else None,
        "errors": sorted({str(r["error"]) for r in recs if r.get("error")}),
        "devices": sorted({str(r["device"]) for r in recs if r.get("device")}),
    }


def fmt_us(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_s(v):
    return "-" if v is None else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def fmt_err(v):
    return "-" if v is None else ("nan" if math.isnan(v) else f"{v:.1e}")


def fmt_table(header, rows):
    """Plain text table; numeric-looking cells right-aligned."""
    w = [len(h) for h in header]
    for r in rows:
        for i, c in enumerate(r):
            w[i] = max(w[i], len(c))
    numeric = re.compile(r"^[-+]?[\d.]+(e[-+]?\d+)?x?$|^-$|^nan$")

    def line(r, head=False):
        cells = []
        for i, c in enumerate(r):
            right = not head and bool(numeric.match(c)) and i > 0
            cells.append(c.rjust(w[i]) if right else c.ljust(w[i]))
        return "  ".join(cells).rstrip()

    out = [line(header, True), "  ".join("-" * x for x in w)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def eligible(row, max_err):
    e = row["max_rel_err"]
    if row["median_us"] is None:
        return False
    if e is not None and (math.isnan(e) or e > max_err):
        return False
    return True


def render(records, a="fusebox", b="torch", workloads=None, max_err=0.1):
    """The whole report as text."""
    out = []
    limits = [r for r in records if r.get("system") == "limit"]
    others = [r for r in records if r.get("system") != "limit"]
    if workloads:
        def wanted(w):
            return any(w == p or w.startswith(p + "_") for p in workloads)
        others = [r for r in others if wanted(str(r["workload"]))]

    if limits:
        rows = []
        for r in sorted(limits, key=lambda r: (natural_key(r["workload"]), r.get("_file", ""))):
            g, f = num(r, "gbps"), num(r, "gflops")
            rate = f"{g:.0f} GB/s" if g is not None else (f"{f / 1e3:.1f} TFLOP/s" if f is not None else "-")
            rows.append([str(r["workload"]), str(r.get("mode", "")), fmt_us(num(r, "median_us")), rate,
                         str(r.get("device", "-")), str(r.get("_file", ""))])
        out.append("## physical limits (measured in each run)")
        out.append(fmt_table(["limit", "how", "median_us", "rate", "device", "file"], rows))
        out.append("")

    by_w = {}
    for r in others:
        by_w.setdefault(str(r["workload"]), {}).setdefault((str(r["system"]), str(r.get("mode", ""))), []).append(r)

    summary = []
    for w in sorted(by_w, key=natural_key):
        groups = by_w[w]
        rows_c = {k: combine(v) for k, v in groups.items()}
        best = {}
        for (sys_, mode), row in rows_c.items():
            if eligible(row, max_err) and (sys_ not in best or row["median_us"] < rows_c[best[sys_]]["median_us"]):
                best[sys_] = (sys_, mode)
        floor = _median([row["floor_us"] for row in rows_c.values()])
        devices = sorted({d for row in rows_c.values() for d in row["devices"]})

        rows = []
        keys = sorted(rows_c, key=lambda k: (_order(k[0], SYSTEM_ORDER), _order(k[1], MODE_ORDER)))
        for k in keys:
            row = rows_c[k]
            m, fl = row["median_us"], row["floor_us"] if row["floor_us"] is not None else floor
            mark = []
            if best.get(k[0]) == k:
                mark.append("<- best " + k[0])
            if not eligible(row, max_err) and m is not None:
                mark.append("! error above --max-err or not finite")
            if row["errors"]:
                mark.append("error: " + "; ".join(e[:60] for e in row["errors"]))
            rows.append([k[0], k[1], fmt_us(m), str(row["n"]),
                         f"{m / fl:.2f}x" if (m is not None and fl) else "-",
                         fmt_s(row["compile_s"]), fmt_s(row["warm_compile_s"]), fmt_err(row["max_rel_err"]),
                         " ".join(mark)])
        out.append(f"## {w}   floor {fmt_us(floor)} us" + (f"   device: {', '.join(devices)}" if devices else ""))
        if len(devices) > 1:
            out.append("WARNING: records from different devices; ratios between them mean nothing")
        out.append(fmt_table(["system", "mode", "median_us", "n", "x_floor", "compile_s", "warm_s", "max_rel_err", ""],
                             rows))
        ba, bb = best.get(a), best.get(b)
        ra, rb = (rows_c[ba] if ba else None), (rows_c[bb] if bb else None)
        line = []
        if ra:
            line.append(f"best {a}: {ba[1]} {fmt_us(ra['median_us'])} us")
        if rb:
            line.append(f"best {b}: {bb[1]} {fmt_us(rb['median_us'])} us")
        speedup = rb["median_us"] / ra["median_us"] if (ra and rb and ra["median_us"] > 0) else None
        if speedup is not None:
            line.append(f"speed-up {b}_best/{a}_best = {speedup:.2f}x")
        if line:
            out.append("; ".join(line))
        out.append("")

        def comp(r):
            return "-" if r is None else f"{fmt_s(r['compile_s'])}/{fmt_s(r['warm_compile_s'])}"
        summary.append([w, fmt_us(floor),
                        f"{fmt_us(ra['median_us'])} ({ba[1]})" if ra else "-",
                        f"{fmt_us(rb['median_us'])} ({bb[1]})" if rb else "-",
                        f"{speedup:.2f}x" if speedup is not None else "-",
                        f"{ra['median_us'] / floor:.2f}x" if (ra and floor) else "-",
                        f"{rb['median_us'] / floor:.2f}x" if (rb and floor) else "-",
                        comp(ra), comp(rb)])
    if summary:
        out.append(f"## summary: best mode of each system (speed-up = {b}_best_us / {a}_best_us)")
        out.append(fmt_table(["workload", "floor_us", f"{a} best us", f"{b} best us", "speed-up",
                              f"{a}/floor", f"{b}/floor", f"{a} compile cold/warm s", f"{b} compile cold/warm s"],
                             summary))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON-lines files or logs ('-' for stdin)")
    ap.add_argument("--a", default="fusebox", help="system in the denominator of the speed-up (default fusebox)")
    ap.add_argument("--b", default="torch", help="system in the numerator of the speed-up (default torch)")
    ap.add_argument("--workloads", default="", help="comma-separated names or prefixes (W3 matches W3_b1_f32, ...)")
    ap.add_argument("--max-err", type=float, default=0.1,
                    help="rows with a larger max_rel_err cannot be a system's best (default 0.1)")
    args = ap.parse_args(argv)
    records = read_records(args.files)
    if not records:
        print("merge_table: no records found", file=sys.stderr)
        return 1
    wl = [w for w in args.workloads.split(",") if w]
    print(render(records, a=args.a, b=args.b, workloads=wl or None, max_err=args.max_err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
