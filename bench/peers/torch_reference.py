#!/usr/bin/env python3
"""bench/peers/torch_reference.py: the PyTorch side of fusebox's GPU benchmarks (W1-W5).

What it runs (shared BENCHMARKS.md, "GPU workloads"):
  W1   y = gelu(x * w + b) * sigmoid(x), x f32 [8192, 8192], w, b f32 [8192], exact (erf) gelu.
  W2   y = layer_norm(softmax(x, -1), gamma, beta, eps=1e-5), x f32 [16384, 4096].
  W3   MLP Linear 1024->4096, GELU (exact), 4096->4096, GELU, 4096->1024, with biases; batch 1, 32,
       256; float32 with TF32 off and bfloat16. Names W3_b{1,32,256}_{f32,bf16}.
  W4   GPT-2 small block: d=768, 12 heads, pre-LayerNorm (eps 1e-5), causal self-attention through
       F.scaled_dot_product_attention(is_causal=True), 4x MLP, residuals; batch 8, sequence 256,
       bfloat16. GELU: the tanh approximation, which is what GPT-2 uses ('gelu_new'); fusebox must
       use the same (--w4-gelu none switches both to exact erf GELU).
  W5   training step: the W3 MLP, batch 256, float32 TF32 off, MSE loss against a random target,
       forward + backward + AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01).
  limits  a device-to-device copy of 1 GiB (bytes read + written over time), and 8192^3 matrix
       products through torch.matmul (cuBLAS) in bf16 and in f32 with TF32 off; every workload's
       floor_us = max(bytes / copy bandwidth, flops / matmul peak of its dtype), with the bytes and
       flops written down in make_specs() below.

Peer configuration (the best honest one; also in each record's `config` field):
  - Plain torch ops in nn.Modules, inference (W1-W4) under torch.inference_mode().
  - Modes: eager; torch.compile(model, mode=M, dynamic=False) for M in default, reduce-overhead,
    max-autotune (W1, W2: max-autotune-no-cudagraphs instead). Each compiled mode runs in its own
    fresh process after torch._dynamo.reset(); modes with CUDA graphs call
    torch.compiler.cudagraph_mark_step_begin() before each call, as PyTorch's docs ask.
  - TF32 off: torch.backends.cuda.matmul.allow_tf32 = False and torch.backends.cudnn.allow_tf32 =
    False (the legacy setters only: mixing them with the new fp32_precision API makes torch >= 2.9
    raise); TORCH_ALLOW_TF32_CUBLAS_OVERRIDE is removed from the children's environment. bf16
    GEMMs keep torch's default reduced-precision reduction.
  - W5: the model is compiled (forward and backward through AOTAutograd); the optimizer is
    torch.optim.AdamW(fused=True) run eagerly in every mode (one multi-tensor kernel: the fastest
    AdamW torch has); zero_grad(set_to_none=True).
  - SDPA picks its own backend (flash / cuDNN / efficient) as torch's defaults allow.

How it measures:
  - Kernels (W1, W2): CUDA events bracket every timed call; >= 10 warm-up calls, then >= 50 timed
    (full: 20 + 100); median (and p10/p90) of the per-call times. One input set (256 MiB, far over
    the L2).
  - Latency workloads (W3, W4, W5: *host*): host wall time of N back-to-back calls with one
    synchronisation after them (never one per call), N chosen so one batch takes about 50 ms
    (quick: 20 ms), 15 batches (quick: 7); the median over the batches of the per-call time. Inputs
    rotate over 4 sets; weights are not rotated (a served model reuses its weights; bf16 W3
    weights are 50 MB, about the size of the L2, and fusebox sees the same).
  - Compile time: compile_s (cold) is the wall time of the first call, compilation included, in a
    fresh process whose TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR point into an empty temporary
    directory made for that (workload, mode); warm_compile_s is the same first-call time in a NEW
    process reusing that directory (FX graph cache and AOTAutograd cache set on explicitly with
    TORCHINDUCTOR_FX_GRAPH_CACHE=1 and TORCHINDUCTOR_AUTOGRAD_CACHE=1, both torch's defaults in
    recent versions; the autotune cache is on by default). Also recorded: first3_s (the first three
    calls: CUDA-graph recording happens in calls 2-3), start_to_first_s (process start, before
    `import torch`, to the first result) and the Inductor cache hit/miss counters.
  - Accuracy: max_rel_err = ||out - ref|| / ||ref|| against a float64 reference computed on the GPU
    from upcast inputs and parameters (W4's reference writes attention out with matmul, mask and
    softmax); fresh seeded random inputs, never zeros. W2: the worse of N(0,1) and 8*N(0,1) inputs
    (at N(0,1) a softmax row's variance is far below eps). W5: the worst of the loss and each
    parameter gradient of one step.

Output: one JSON object per line on stdout per measurement (workload, system `torch` or `limit`,
mode, threads (null), median_us, floor_us, compile_s, warm_compile_s, gbps, gflops, max_rel_err,
device, torch, then details), then a line `# table` and a table per workload (bench/peers/
merge_table.py, which also merges these lines with fusebox's). Progress goes to stderr.

Run (on the GPU machine; plain python3 there holds torch):
    python3 bench/peers/torch_reference.py --quick                 # no max-autotune, fewer reps
    python3 bench/peers/torch_reference.py --json-out $OUT/torch.jsonl
    python3 bench/peers/torch_reference.py --workloads W1,W2 --modes eager,default
    python3 bench/peers/torch_reference.py --dry-run               # anywhere, no torch: plan + self-check
Expected run time on an H100 (estimates, not measured yet): every compiled (workload, mode) costs a
cold process (4-6 s of Python, torch and CUDA start, 10-25 s of cold compile, a few s of timing)
and a warm one (4-6 s start, 2-5 s warm compile). --quick: 41 processes, about 9-11 minutes
(--no-warm: about 7). The full set adds max-autotune's GEMM autotuning (about 1-2 min for each W3
variant, 2 for W4, 3-4 for W5): about 30-40 minutes. One device command may run 10 minutes, so
split the run into parts, each with its own --json-out, and merge them with merge_table.py, e.g.
    --quick --workloads W1,W2,W4,W5        (about 5 min)      --quick --workloads W3   (about 6 min)
    --modes max-autotune --workloads W3_b1_f32,W3_b32_f32,W3_b256_f32 (and so on, 2-3 workloads a part)
--budget-s S starts no new compiled measurement after S seconds, so a part ends inside its limit.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

_T_START = time.perf_counter()  # process start, before torch is imported (start_to_first_s)

REC_PREFIX = "@@REC "
MIB = 1 << 20

# ---- workloads: sizes, bytes and flops (no torch needed) -------------------------------------------

W3_DIMS = (1024, 4096, 4096, 1024)  # in, hidden, hidden, out
W3_WEIGHTS = sum(a * b for a, b in zip(W3_DIMS[:-1], W3_DIMS[1:]))  # 1024*4096 + 4096*4096 + 4096*1024
W3_BIASES = sum(W3_DIMS[1:])
W4_B, W4_T, W4_D, W4_H = 8, 256, 768, 12
W5_BATCH = 256
ELT = {"f32": 4, "bf16": 2}


class Spec:
    """One workload: its shape, its timing kind and the work its floor is computed from.

    bytes: the fewest bytes the work must move through device memory (each input read once, each
    output written once); flops: the matrix-product flops (elementwise arithmetic is not counted:
    its rate is not what bounds these workloads); peak: which measured matmul rate the flops are
    divided by ('bf16', 'f32', or None where the floor is bytes alone).
    """

    def __init__(self, name, kind, dtype, bytes_, flops, peak, modes, batch=None, note="", bytes_how="",
                 flops_how=""):
        self.name, self.kind, self.dtype = name, kind, dtype
        self.bytes, self.flops, self.peak = bytes_, flops, peak
        self.modes, self.batch, self.note = modes, batch, note
        self.bytes_how, self.flops_how = bytes_how, flops_how


MODES_KERNEL = ["eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
MODES_HOST = ["eager", "default", "reduce-overhead", "max-autotune"]
CUDAGRAPH_MODES = {"reduce-overhead", "max-autotune"}


def make_specs(w4_gelu="tanh"):
    s = {}
    n1 = 8192 * 8192
    s["W1"] = Spec("W1", "kernel", "f32", 4 * n1 * 2 + 2 * 4 * 8192, 0, None, MODES_KERNEL,
                   note="exact (erf) gelu",
                   bytes_how="read x 256 MiB + write y 256 MiB + w, b 64 KiB")
    n2 = 16384 * 4096
    s["W2"] = Spec("W2", "kernel", "f32", 4 * n2 * 2 + 2 * 4 * 4096, 0, None, MODES_KERNEL,
                   note="max_rel_err: the worse of x ~ N(0,1) and x ~ 8*N(0,1) (at N(0,1) a softmax row's "
                        "variance is far below eps)",
                   bytes_how="read x 256 MiB + write y 256 MiB + gamma, beta 32 KiB")
    for dt in ("f32", "bf16"):
        for b in (1, 32, 256):
            e = ELT[dt]
            s[f"W3_b{b}_{dt}"] = Spec(
                f"W3_b{b}_{dt}", "host", dt, (W3_WEIGHTS + W3_BIASES) * e + 2 * b * W3_DIMS[0] * e,
                2 * b * W3_WEIGHTS, dt, MODES_HOST, batch=b,
                note="inputs rotate over 4 sets; weights are not rotated",
                bytes_how="weights + biases + x + y",
                flops_how="2*B*(1024*4096 + 4096*4096 + 4096*1024)")
    d, n_tok = W4_D, W4_B * W4_T
    w4_params = 12 * d * d + 13 * d  # ln1 2d, qkv 3d^2+3d, proj d^2+d, ln2 2d, fc 4d^2+4d, proj 4d^2+d
    w4_flops = 24 * n_tok * d * d + 4 * W4_B * d * (W4_T * (W4_T + 1) // 2)
    s["W4"] = Spec("W4", "host", "bf16", 2 * w4_params + 2 * 2 * n_tok * d, w4_flops, "bf16", MODES_HOST,
                   batch=W4_B,
                   note=("GELU: tanh approximation (GPT-2's gelu_new)" if w4_gelu == "tanh" else "GELU: exact (erf)")
                   + "; attention: F.scaled_dot_product_attention(is_causal=True); inputs rotate over 4 sets",
                   bytes_how="12*d^2+13*d bf16 parameters + x + y (B*T*d each)",
                   flops_how="24*B*T*d^2 (the four projections) + 4*B*d*T*(T+1)/2 (causal QK^T and PV)")
    b5 = W5_BATCH
    s["W5"] = Spec("W5", "host", "f32", 6 * 4 * (W3_WEIGHTS + W3_BIASES) + 2 * b5 * W3_DIMS[0] * 4,
                   6 * b5 * W3_WEIGHTS - 2 * b5 * W3_DIMS[0] * W3_DIMS[1], "f32", MODES_HOST, batch=b5,
                   note="max_rel_err: worst of the loss and each parameter gradient of one step vs float64; "
                        "AdamW(fused=True) eager in every mode, torch.compile on the model (forward+backward)",
                   bytes_how="AdamW: read params, m, v and write params, m, v (6*4*P) + x + target",
                   flops_how="forward 2BP + weight grads 2BP + input grads of layers 2, 3")
    return s


def floor_us(spec, limits):
    """max(bytes / bandwidth, flops / peak) in microseconds, from measured limits (bytes/s, flop/s)."""
    bw = limits.get("copy")
    if not bw:
        return None
    t = spec.bytes / bw
    if spec.flops and spec.peak:
        pk = limits.get("matmul_" + spec.peak)
        if not pk:
            return None
        t = max(t, spec.flops / pk)
    return t * 1e6


def select_workloads(specs, filt):
    if not filt or filt == "all":
        return list(specs)
    toks = [t.strip() for t in filt.split(",") if t.strip()]
    out = [w for w in specs if any(w == t or w.startswith(t + "_") for t in toks)]
    unknown = [t for t in toks if not any(w == t or w.startswith(t + "_") for w in specs)]
    if unknown:
        raise SystemExit(f"torch_reference: unknown workload(s) {unknown}; known: {', '.join(specs)}")
    return out


def select_modes(spec, filt, quick):
    modes = list(spec.modes)
    if quick:
        modes = [m for m in modes if not m.startswith("max-autotune")]
    if filt and filt != "all":
        toks = [t.strip() for t in filt.split(",") if t.strip()]
        known = set(MODES_KERNEL) | set(MODES_HOST)
        bad = [t for t in toks if t not in known]
        if bad:
            raise SystemExit(f"torch_reference: unknown mode(s) {bad}; known: {', '.join(sorted(known))}")
        # 'max-autotune' also selects W1/W2's max-autotune-no-cudagraphs.
        modes = [m for m in modes if m in toks or (m.startswith("max-autotune") and "max-autotune" in toks)]
    return modes


# ---- records -----------------------------------------------------------------------------------------

FIELD_ORDER = ["workload", "system", "mode", "threads", "median_us", "floor_us", "compile_s", "warm_compile_s",
               "gbps", "gflops", "max_rel_err", "device", "torch"]


def clean(v):
    """JSON-safe value: non-finite floats become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def finalize(rec, specs, limits):
    """Adds floor_us, gbps, gflops from the limits; orders the fields; makes it JSON-safe."""
    r = dict(rec)
    spec = specs.get(r.get("workload"))
    if spec is not None and r.get("system") == "torch":
        r["floor_us"] = floor_us(spec, limits)
        r["bytes"], r["flops"] = spec.bytes, spec.flops
        m = r.get("median_us")
        if m:
            if spec.kind == "kernel":
                r["gbps"] = spec.bytes / (m * 1e3)
            if spec.flops:
                r["gflops"] = spec.flops / (m * 1e3)
    r.setdefault("threads", None)
    out = {k: r.get(k) for k in FIELD_ORDER}
    for k, v in r.items():
        if k not in out:
            out[k] = v
    return clean(out)


def dumps(rec):
    return json.dumps(clean(rec), separators=(",", ":"), allow_nan=False)


_ROLE = "torchref"


def log(msg):
    print(f"[{_ROLE} {time.perf_counter() - _T_START:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---- the child side (imports torch) ------------------------------------------------------------------

def _import_torch():
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("torch_reference: CUDA is not available")
    # TF32 off through the legacy setters alone (see the header).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _env_info(torch):
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - optional
        pass
    return info


def _rel_err(out, ref):
    o, r = out.detach().double(), ref.detach().double()
    if not bool(o.isfinite().all()):
        return float("nan")
    return float((o - r).norm() / r.norm())


def _modules(torch):
    nn, F = torch.nn, torch.nn.functional

    class W1(nn.Module):
        def __init__(self, cols):
            super().__init__()
            self.w = nn.Parameter(torch.randn(cols, device="cuda"))
            self.b = nn.Parameter(torch.randn(cols, device="cuda"))

        def forward(self, x):
            return F.gelu(x * self.w + self.b) * torch.sigmoid(x)

    class W2(nn.Module):
        def __init__(self, cols):
            super().__init__()
            self.gamma = nn.Parameter(1 + 0.1 * torch.randn(cols, device="cuda"))
            self.beta = nn.Parameter(0.1 * torch.randn(cols, device="cuda"))

        def forward(self, x):
            return F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), self.gamma, self.beta, eps=1e-5)

    class MLP(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.fc1 = nn.Linear(dims[0], dims[1], device="cuda")
            self.fc2 = nn.Linear(dims[1], dims[2], device="cuda")
            self.fc3 = nn.Linear(dims[2], dims[3], device="cuda")

        def forward(self, x):
            return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))

    class Block(nn.Module):
        """GPT-2 block: x + attn(ln1(x)), then + mlp(ln2(x))."""

        def __init__(self, d, heads, gelu_approx):
            super().__init__()
            self.heads, self.gelu_approx, self.use_sdpa = heads, gelu_approx, True
            self.ln1 = nn.LayerNorm(d, eps=1e-5, device="cuda")
            self.qkv = nn.Linear(d, 3 * d, device="cuda")
            self.attn_proj = nn.Linear(d, d, device="cuda")
            self.ln2 = nn.LayerNorm(d, eps=1e-5, device="cuda")
            self.fc = nn.Linear(d, 4 * d, device="cuda")
            self.mlp_proj = nn.Linear(4 * d, d, device="cuda")
            with torch.no_grad():  # LayerNorm weights and biases random, never the 1/0 defaults
                for ln in (self.ln1, self.ln2):
                    ln.weight.copy_(1 + 0.1 * torch.randn_like(ln.weight))
                    ln.bias.copy_(0.1 * torch.randn_like(ln.bias))

        def forward(self, x):
            B, T, C = x.shape
            H = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, H, C // H).transpose(1, 2)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            if self.use_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # the float64 reference: attention written out
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                keep = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~keep, float("-inf"))
                y = torch.softmax(att, dim=-1) @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate=self.gelu_approx))

    return W1, W2, MLP, Block


class Built:
    """A workload made concrete on the GPU: model, timing input sets, runner and accuracy check."""

    def __init__(self, torch, spec, args):
        import contextlib
        import copy
        self.torch, self.spec = torch, spec
        F = torch.nn.functional
        W1, W2, MLP, Block = _modules(torch)
        torch.manual_seed(args.seed)
        dt = {"f32": torch.float32, "bf16": torch.bfloat16}[spec.dtype]
        self.grad = spec.name == "W5"
        self.context = (contextlib.nullcontext if self.grad else torch.inference_mode)
        self.copy = copy
        self.opt = None
        name = spec.name
        if name == "W1":
            self.model = W1(8192)
            self.shapes = [(8192, 8192)]
        elif name == "W2":
            self.model = W2(4096)
            self.shapes = [(16384, 4096)]
        elif name.startswith("W3_") or name == "W5":
            self.model = MLP(W3_DIMS).to(dt)
            self.shapes = [(spec.batch, W3_DIMS[0])]
        elif name == "W4":
            self.model = Block(W4_D, W4_H, args.w4_gelu).to(dt)
            self.shapes = [(W4_B, W4_T, W4_D)]
        else:
            raise ValueError(name)
        if name == "W5":
            self.shapes = [(W5_BATCH, W3_DIMS[0]), (W5_BATCH, W3_DIMS[-1])]  # x, target
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                         weight_decay=0.01, fused=True)
        else:
            self.model.eval()
        self.dtype = dt
        n_sets = 1 if spec.kind == "kernel" else 4
        self.sets = [self.fresh_inputs() for _ in range(n_sets)]
        # Accuracy inputs: fresh, seeded, made here (outside inference mode, like the timing sets, so
        # the compiled code's guards see the same kind of tensor and nothing recompiles).
        torch.manual_seed(args.seed + 1000)
        self.check_sets = [self.fresh_inputs(sc) for sc in ((1.0, 8.0) if name == "W2" else (1.0,))]
        # The float64 reference of an inference workload: the module upcast (bf16 parameters upcast
        # exactly); W4's writes attention out. W5 makes its own from the parameters of the moment.
        self.ref = None
        if not self.grad:
            self.ref = copy.deepcopy(self.model).double()
            if hasattr(self.ref, "use_sdpa"):
                self.ref.use_sdpa = False
        self.F = F

    def fresh_inputs(self, scale=1.0):
        t = self.torch
        return tuple((scale * t.randn(s, device="cuda", dtype=t.float32)).to(self.dtype) for s in self.shapes)

    def make_runner(self, m, cudagraphs):
        torch, F = self.torch, self.F
        mark = torch.compiler.cudagraph_mark_step_begin if cudagraphs else None
        if not self.grad:
            if mark is None:
                return lambda a: m(*a)

            def run_cg(a):
                mark()
                return m(*a)
            return run_cg
        opt = self.opt

        def step(a):
            x, target = a
            if mark is not None:
                mark()
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(m(x), target)
            loss.backward()
            opt.step()
            return loss
        return step

    def check(self, m, cudagraphs):
        """max_rel_err of m (the model as run: eager or compiled) against float64, on fresh inputs."""
        torch, F = self.torch, self.F
        mark = torch.compiler.cudagraph_mark_step_begin if cudagraphs else (lambda: None)
        if self.grad:
            x, target = self.check_sets[0]
            mark()
            self.opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(m(x), target)
            loss.backward()
            got = [loss.detach().clone()] + [p.grad.detach().clone() for p in self.model.parameters()]
            self.opt.zero_grad(set_to_none=True)
            ref = self.copy.deepcopy(self.model).double()
            rloss = F.mse_loss(ref(x.double()), target.double())
            rloss.backward()
            refs = [rloss.detach()] + [p.grad for p in ref.parameters()]
            errs = [_rel_err(a, b) for a, b in zip(got, refs)]
            del ref, refs, got
            return float("nan") if any(math.isnan(e) for e in errs) else max(errs)
        worst = 0.0
        for a in self.check_sets:
            mark()
            out = m(*a).detach().clone()
            r = self.ref(*[t.double() for t in a])
            e = _rel_err(out, r)
            worst = e if (math.isnan(e) or math.isnan(worst)) else max(worst, e)
            del out, r
        return worst


def _summary(samples, warmup, iters, how, **extra):
    s = sorted(samples)

    def pct(p):
        return s[min(len(s) - 1, max(0, int(round(p * (len(s) - 1)))))]
    return dict(median_us=statistics.median(s), p10_us=pct(0.1), p90_us=pct(0.9), min_us=s[0], warmup=warmup,
                iters=iters, timing=how, **extra)


def time_events(torch, fn, sets, warmup, iters):
    """CUDA events around every call; one synchronisation at the end."""
    k = len(sets)
    out = None
    for i in range(warmup):
        out = fn(sets[i % k])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    gc.disable()
    try:
        for i, (s, e) in enumerate(ev):
            a = sets[i % k]
            s.record()
            out = fn(a)
            e.record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    del out
    return _summary([s.elapsed_time(e) * 1e3 for s, e in ev], warmup, iters, "cuda_events_per_call")


def time_host(torch, fn, sets, warmup, batches, batch_s):
    """Host wall time of N back-to-back calls, one synchronisation after them; median over batches."""
    k = len(sets)
    out = None
    for i in range(warmup):
        out = fn(sets[i % k])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(5):
        out = fn(sets[i % k])
    torch.cuda.synchronize()
    est = (time.perf_counter() - t0) / 5
    n = int(min(2000, max(10, batch_s / max(est, 1e-7))))
    per = []
    gc.disable()
    try:
        for _ in range(batches):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                out = fn(sets[i % k])
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) / n * 1e6)
    finally:
        gc.enable()
    del out
    return _summary(per, warmup, n * batches, "host_wall_sync_after_n", calls_per_batch=n, batches=batches)


def _reps(args):
    if args.quick:
        return dict(k_warmup=10, k_iters=50, h_warmup=10, h_batches=7, h_batch_s=0.02)
    return dict(k_warmup=20, k_iters=100, h_warmup=20, h_batches=15, h_batch_s=0.05)


def measure(torch, built, run, args):
    r = _reps(args)
    if built.spec.kind == "kernel":
        return time_events(torch, run, built.sets, r["k_warmup"], r["k_iters"])
    return time_host(torch, run, built.sets, r["h_warmup"], r["h_batches"], r["h_batch_s"])


def _config(spec, mode, args):
    parts = []
    if mode == "eager":
        parts.append("eager")
    else:
        parts.append(f"torch.compile(model, mode='{mode}', dynamic=False), fresh process, torch._dynamo.reset()")
        if mode in CUDAGRAPH_MODES:
            parts.append("CUDA graphs (cudagraph trees), cudagraph_mark_step_begin() before each call")
        if args.inductor_freezing and spec.name != "W5":
            parts.append("torch._inductor.config.freezing=True")
    parts.append("training step, grad on" if spec.name == "W5" else "torch.inference_mode()")
    if spec.dtype == "f32":
        parts.append("TF32 off (cuda.matmul.allow_tf32=False, cudnn.allow_tf32=False)")
    else:
        parts.append("bf16 params and inputs, torch default bf16 reduced-precision reduction")
    if spec.name == "W5":
        parts.append("AdamW(lr=1e-3, betas=(0.9,0.999), eps=1e-8, weight_decay=0.01, fused=True), eager; "
                     "MSE loss; zero_grad(set_to_none=True)")
    return "; ".join(parts)


def _cache_counters(torch):
    try:
        from torch._dynamo.utils import counters
        out = {}
        for group in ("inductor", "aot_autograd"):
            for k, v in counters.get(group, {}).items():
                if "cache" in k and v:
                    out[f"{group}.{k}"] = int(v)
        return out
    except Exception:  # noqa: BLE001 - best effort
        return {}


def _emit_child(rec):
    print(REC_PREFIX + dumps(rec), flush=True)


def child_base(args, specs):
    """Physical limits, then every selected workload in eager mode."""
    torch = _import_torch()
    info = _env_info(torch)
    base = dict(system="limit", mode="torch", threads=None, **info)
    try:
        # Device-to-device copy: bytes read + bytes written over the time.
        n = args.copy_mib * MIB // 4
        src = torch.randn(n, device="cuda")
        dst = torch.empty_like(src)
        t = time_events(torch, lambda a: dst.copy_(src), [()], 5, 30)
        by = 2 * n * 4
        _emit_child(dict(base, workload="limit_copy", median_us=t["median_us"], min_us=t["min_us"],
                         gbps=by / (t["median_us"] * 1e3), bytes=by, iters=t["iters"],
                         note=f"dst.copy_(src), {args.copy_mib} MiB f32, bytes read + written"))
        del src, dst
        for dtn, dt, reps in (("bf16", torch.bfloat16, 30), ("f32", torch.float32, 10)):
            a = torch.randn(8192, 8192, device="cuda", dtype=dt)
            b = torch.randn(8192, 8192, device="cuda", dtype=dt)
            t = time_events(torch, lambda _: torch.matmul(a, b), [()], 3, reps)
            fl = 2 * 8192 ** 3
            _emit_child(dict(base, workload=f"limit_matmul_{dtn}", median_us=t["median_us"], min_us=t["min_us"],
                             gflops=fl / (t["median_us"] * 1e3), flops=fl, iters=t["iters"],
                             note="torch.matmul 8192^3 on random data"
                             + (", TF32 off" if dtn == "f32" else "")))
            del a, b
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        log(f"limits failed: {e!r}")
        _emit_child(dict(base, workload="limit_copy", error=repr(e)))
    for name in args.eager:
        spec = specs[name]
        log(f"{name} eager")
        try:
            built = Built(torch, spec, args)
            run = built.make_runner(built.model, False)
            with built.context():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = run(built.sets[0])
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                del out
                err = built.check(built.model, False)
                t = measure(torch, built, run, args)
            rec = dict(workload=name, system="torch", mode="eager", threads=None, median_us=t.pop("median_us"),
                       compile_s=None, warm_compile_s=None, max_rel_err=err, **info, first_call_s=first, **t,
                       dtype=spec.dtype, batch=spec.batch, config=_config(spec, "eager", args), note=spec.note)
            _emit_child(rec)
            log(f"{name} eager: {rec['median_us']:.1f} us, err {err:.2e}")
            del built, run
        except Exception as e:  # noqa: BLE001
            log(f"{name} eager failed: {e!r}")
            _emit_child(dict(workload=name, system="torch", mode="eager", threads=None, error=repr(e), **info))
        gc.collect()
        torch.cuda.empty_cache()


def child_compiled(args, specs):
    """One (workload, mode): first call (compile), accuracy, and (cold phase) the timing."""
    torch = _import_torch()
    info = _env_info(torch)
    spec, mode = specs[args.workload], args.mode
    if args.inductor_freezing and spec.name != "W5":
        import torch._inductor.config as icfg
        icfg.freezing = True
    built = Built(torch, spec, args)
    torch._dynamo.reset()
    cm = torch.compile(built.model, mode=mode, dynamic=False)
    cg = mode in CUDAGRAPH_MODES
    run = built.make_runner(cm, cg)
    with built.context():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = run(built.sets[0])
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        del out
        for i in (1, 2):
            out = run(built.sets[i % len(built.sets)])
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        del out
        counters = _cache_counters(torch)
        err = built.check(cm, cg)
        t = measure(torch, built, run, args) if args.phase == "cold" else None
    rec = dict(workload=spec.name, system="torch", mode=mode, threads=None, phase=args.phase,
               compile_s=t1 - t0, first3_s=t3 - t0, start_to_first_s=t1 - _T_START, max_rel_err=err,
               cache_counters=counters, **info, dtype=spec.dtype, batch=spec.batch,
               config=_config(spec, mode, args), note=spec.note,
               inductor_cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    if t is not None:
        rec["median_us"] = t.pop("median_us")
        rec.update(t)
    _emit_child(rec)


# ---- the parent side (no torch) ----------------------------------------------------------------------

def child_env(cache_dir=None):
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", None)
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    if cache_dir:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
        env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
        env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    return env


def _common_child_args(args):
    a = ["--seed", str(args.seed), "--w4-gelu", args.w4_gelu, "--copy-mib", str(args.copy_mib)]
    if args.quick:
        a.append("--quick")
    if args.inductor_freezing:
        a.append("--inductor-freezing")
    return a


def run_child(argv, env, timeout, on_record):
    """Runs one child; its records go to on_record, its other stdout to our stderr. Returns (rc, why).

    The child gets its own process group, so that on a timeout it goes together with anything it
    started (Inductor's compile workers); stdout is read by a thread, so that a leftover process
    holding the pipe cannot hold us once the child itself has exited.
    """
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=None, env=env, text=True, errors="replace",
                         bufsize=1, start_new_session=True)

    def kill_group():
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def reader():
        for line in p.stdout:
            if line.startswith(REC_PREFIX):
                try:
                    on_record(json.loads(line[len(REC_PREFIX):]))
                    continue
                except ValueError:
                    pass
            sys.stderr.write(line)
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    why = ""
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group()
        rc = p.wait()
        why = f"timeout after {timeout}s"
    except KeyboardInterrupt:
        kill_group()
        raise
    th.join(10)
    if th.is_alive():  # a descendant still holds the pipe: end the group's leftovers
        kill_group()
        th.join(5)
    if not why and rc != 0:
        why = f"exit status {rc}"
    return rc, why


def parent(args, specs):
    wls = select_workloads(specs, args.workloads)
    plan = [(w, m) for w in wls for m in select_modes(specs[w], args.modes, args.quick)]
    eager = [w for w, m in plan if m == "eager"]
    compiled = [(w, m) for w, m in plan if m != "eager"]
    me = [sys.executable, os.path.abspath(__file__)]
    common = _common_child_args(args)
    timeout = args.child_timeout or (600 if args.quick else 1200)
    jf = open(args.json_out, "w", encoding="utf-8") if args.json_out else None
    records, limits, skipped = [], {}, []

    def emit(rec):
        r = finalize(rec, specs, limits)
        line = dumps(r)
        print(line, flush=True)
        if jf:
            jf.write(line + "\n")
            jf.flush()
        records.append(r)

    def on_base(rec):
        if rec.get("system") == "limit" and rec.get("median_us"):
            if rec["workload"] == "limit_copy":
                limits["copy"] = rec["gbps"] * 1e9
            elif rec["workload"].startswith("limit_matmul_"):
                limits["matmul_" + rec["workload"][len("limit_matmul_"):]] = rec["gflops"] * 1e9
        emit(rec)

    log(f"plan: {len(plan)} measurements ({len(eager)} eager in one process, {len(compiled)} compiled, "
        f"{'no warm runs' if args.no_warm else 'each with a cold and a warm process'})")
    try:
        rc, why = run_child(me + ["--child", "base", "--eager", ",".join(eager)] + common, child_env(), timeout,
                            on_base)
        if why:
            log(f"base process (limits + eager): {why}")
        cache_root = args.cache_root or tempfile.gettempdir()
        for w, m in compiled:
            if args.budget_s and time.perf_counter() - _T_START > args.budget_s:
                skipped.append(f"{w}/{m}")
                continue
            cache = tempfile.mkdtemp(prefix=f"torchref_{w}_{m}_", dir=cache_root)
            got = []
            log(f"{w} {m}: cold compile and timing (cache {cache})")
            cargs = me + ["--child", "compiled", "--workload", w, "--mode", m] + common
            rc, why = run_child(cargs + ["--phase", "cold"], child_env(cache), timeout, got.append)
            rec = got[0] if got else dict(workload=w, system="torch", mode=m, error=why or "no record")
            if why and not got:
                log(f"{w} {m}: cold run failed: {why}")
            if not args.no_warm and got:
                warm = []
                rc, why = run_child(cargs + ["--phase", "warm"], child_env(cache), timeout, warm.append)
                if warm:
                    rec["warm_compile_s"] = warm[0].get("compile_s")
                    rec["warm_first3_s"] = warm[0].get("first3_s")
                    rec["warm_start_to_first_s"] = warm[0].get("start_to_first_s")
                    rec["warm_max_rel_err"] = warm[0].get("max_rel_err")
                    rec["warm_cache_counters"] = warm[0].get("cache_counters")
                else:
                    rec["warm_error"] = why or "no record"
            rec.pop("phase", None)
            emit(rec)
            if rec.get("median_us") is not None:
                log(f"{w} {m}: {rec['median_us']:.1f} us, compile {rec.get('compile_s') or 0:.1f} s cold, "
                    f"{rec.get('warm_compile_s') or float('nan'):.1f} s warm, err {rec.get('max_rel_err')}")
            if not args.keep_caches:
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        if jf:
            jf.close()
    print("# table")
    if skipped:
        print("# skipped (--budget-s): " + ", ".join(skipped))
    print(_table(records))
    return 0


def _table(records):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import merge_table
    except ImportError:
        return "\n".join(f"{r['workload']:14s} {r.get('mode', ''):28s} {r.get('median_us')}" for r in records)
    return merge_table.render(records, a="fusebox", b="torch")


# ---- dry run: the plan and a self-check, without torch ----------------------------------------------

def dry_run(args, specs):
    assert "torch" not in sys.modules
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok    " if cond else "FAIL  ") + what)
        ok = ok and bool(cond)

    wls = select_workloads(specs, args.workloads)
    plan = [(w, m) for w in wls for m in select_modes(specs[w], args.modes, args.quick)]
    nominal = {"copy": 3.0e12, "matmul_bf16": 790e12, "matmul_f32": 50e12}  # H100 figures (leads; f32 assumed)
    print("# plan (floor at nominal H100 limits: copy 3.0 TB/s, bf16 790 TFLOP/s, f32 50 TFLOP/s)")
    for w in wls:
        s = specs[w]
        print(f"{w:14s} {s.kind:6s} {s.dtype:4s} bytes {s.bytes / MIB:9.2f} MiB  flops {s.flops / 1e9:8.2f} G  "
              f"floor {floor_us(s, nominal):8.1f} us  modes {','.join(select_modes(s, args.modes, args.quick))}")
    n_children = 1 + sum(1 if args.no_warm else 2 for _, m in plan if m != "eager")
    print(f"# {len(plan)} measurements, {n_children} child processes")
    me = [sys.executable, os.path.abspath(__file__)]
    for w, m in plan[:3]:
        if m != "eager":
            print("# e.g. " + " ".join(me + ["--child", "compiled", "--workload", w, "--mode", m, "--phase", "cold"]
                                      + _common_child_args(args)))
    # Self-check of the arithmetic the floors rest on.
    check(specs["W1"].bytes == 512 * MIB + 64 * 1024, "W1 bytes = 512 MiB + w, b")
    check(specs["W2"].bytes == 512 * MIB + 32 * 1024, "W2 bytes = 512 MiB + gamma, beta")
    for b in (1, 32, 256):
        check(specs[f"W3_b{b}_f32"].flops == 2 * b * (1024 * 4096 + 4096 * 4096 + 4096 * 1024), f"W3 b{b} flops")
        check(specs[f"W3_b{b}_bf16"].bytes * 2 == specs[f"W3_b{b}_f32"].bytes, f"W3 b{b} bf16 bytes half of f32")
    check(specs["W3_b1_f32"].bytes == 4 * (25165824 + 9216) + 2 * 4 * 1024, "W3 b1 f32 bytes")
    qkv, proj, fc, fc2 = 3 * 768 * 768, 768 * 768, 768 * 3072, 3072 * 768
    att = 2 * (2 * 8 * 12 * 64 * (256 * 257 // 2))
    check(specs["W4"].flops == 2 * 2048 * (qkv + proj + fc + fc2) + att, "W4 flops = projections + causal attention")
    check(specs["W5"].flops == 2 * 256 * W3_WEIGHTS * 2 + 2 * 256 * (4096 * 4096 + 4096 * 1024), "W5 flops")
    check(abs(floor_us(specs["W1"], nominal) - (512 * MIB + 65536) / 3.0e12 * 1e6) < 1e-6, "W1 floor = bytes/bw")
    check(floor_us(specs["W3_b256_f32"], nominal) == specs["W3_b256_f32"].flops / 50e12 * 1e6, "W3 b256 f32 compute-bound")
    check(all(select_modes(specs[w], "max-autotune", False)[0].startswith("max-autotune") for w in specs),
          "--modes max-autotune selects W1/W2's no-cudagraphs variant")
    check("max-autotune" not in select_modes(specs["W4"], "", True), "--quick drops max-autotune")
    check(select_workloads(specs, "W3") == [w for w in specs if w.startswith("W3_")], "--workloads W3 prefix")
    # Records: finalize + JSON + the table, on made-up numbers.
    limits = {"copy": 3.0e12, "matmul_bf16": 700e12, "matmul_f32": 50e12}
    fake = [finalize(dict(workload="limit_copy", system="limit", mode="torch", median_us=700.0, gbps=3067.0,
                          device="dry-run"), specs, limits)]
    for w in wls:
        for i, m in enumerate(select_modes(specs[w], args.modes, args.quick)):
            fake.append(finalize(dict(workload=w, system="torch", mode=m, median_us=100.0 + 10 * i,
                                      compile_s=None if m == "eager" else 12.0, warm_compile_s=None if m == "eager"
                                      else 2.0, max_rel_err=1e-6 if specs[w].dtype == "f32" else 3e-3,
                                      device="dry-run", torch="none", nan_field=float("nan")), specs, limits))
        fake.append(finalize(dict(workload=w, system="fusebox", mode="jit", median_us=80.0, compile_s=0.5,
                                  max_rel_err=2e-7, device="dry-run"), specs, limits))
    lines = [dumps(r) for r in fake]
    check(all(json.loads(x)["floor_us"] is not None for x in lines if json.loads(x)["system"] == "torch"),
          "every torch record gets a floor")
    check(all("NaN" not in x and "Infinity" not in x for x in lines), "JSON lines are strict JSON")
    check(list(json.loads(lines[1]))[:13] == FIELD_ORDER, "field order")
    table = _table([json.loads(x) for x in lines])
    check("speed-up" in table and "best torch" in table, "table renders (merge_table)")
    print("# table (made-up numbers)")
    print(table)
    print("# dry run " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


# ---- command line ------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch reference for fusebox's GPU benchmarks W1-W5 "
                                             "(see the header of this file).")
    ap.add_argument("--workloads", default="all",
                    help="comma-separated names or prefixes: W1,W2,W3 (all six W3_*),W3_b1_f32,W4,W5 (default all)")
    ap.add_argument("--modes", default="all",
                    help="comma-separated: eager,default,reduce-overhead,max-autotune (also selects W1/W2's "
                         "max-autotune-no-cudagraphs) (default all)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no max-autotune")
    ap.add_argument("--json-out", default="", help="also write the JSON lines to this file")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm-cache compile runs")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no new compiled measurement after this many seconds (0: no limit)")
    ap.add_argument("--child-timeout", type=int, default=0,
                    help="seconds before one child process is killed (default 1200, quick 600)")
    ap.add_argument("--cache-root", default="", help="where the per-(workload, mode) Inductor caches go (default: tmp)")
    ap.add_argument("--keep-caches", action="store_true", help="keep the Inductor cache directories")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--w4-gelu", choices=["tanh", "none"], default="tanh",
                    help="W4's GELU: tanh approximation as GPT-2 (default) or exact erf ('none')")
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth buffer (>= 256)")
    ap.add_argument("--inductor-freezing", action="store_true",
                    help="set torch._inductor.config.freezing=True for W1-W4 (off by default)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and self-check without torch or a GPU")
    # Internal: the child processes.
    ap.add_argument("--child", choices=["base", "compiled"], help=argparse.SUPPRESS)
    ap.add_argument("--eager", default="", help=argparse.SUPPRESS)
    ap.add_argument("--workload", default="", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="", help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=["cold", "warm"], default="cold", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.copy_mib < 256:
        ap.error("--copy-mib must be at least 256")
    specs = make_specs(args.w4_gelu)
    if args.child:
        global _ROLE
        _ROLE = "torchref child"
    if args.dry_run:
        return dry_run(args, specs)
    if args.child == "base":
        args.eager = [w for w in args.eager.split(",") if w]
        child_base(args, specs)
        return 0
    if args.child == "compiled":
        child_compiled(args, specs)
        return 0
    return parent(args, specs)


if __name__ == "__main__":
    sys.exit(main())
