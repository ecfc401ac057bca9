"""Where torch's W4 spends its device time: each kernel of one forward call, eager and
torch.compile (default mode), from torch.profiler (CUPTI), mean over 20 profiled calls after
warm-up. The counterpart of fusebox's `FUSEBOX_DEVICE_TIMES=1 bench_gpu --only W4`, so the two
blocks can be compared kernel by kernel in the same device call.

    python3 bench/peers/torch_kernel_times.py [--modes eager,default]
    ncu --nvtx --nvtx-include "w4/" ... python3 bench/peers/torch_kernel_times.py --once
        (one eager call after warm-up inside an NVTX range "w4", for Nsight Compute)
"""
import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402  (the model definitions, so both scripts time one block)


def kernel_times(fn, x, calls=20):
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    per_kernel = collections.OrderedDict()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel.setdefault(e.name, []).append(e.device_time)
    return [(name, sum(t) / calls, len(t) // calls) for name, t in per_kernel.items()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="eager,default")
    p.add_argument("--once", action="store_true")
    args = p.parse_args()
    _, _, _, Block = ref._modules(torch)
    torch.manual_seed(0)
    block = Block(ref.W4_D, ref.W4_H, "tanh").to(torch.bfloat16)
    x = torch.randn(ref.W4_B, ref.W4_T, ref.W4_D, device="cuda", dtype=torch.bfloat16)
    if args.once:
        with torch.inference_mode():
            for _ in range(5):
                block(x)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("w4")
            block(x)
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
        return
    for mode in args.modes.split(","):
        fn = block if mode == "eager" else torch.compile(block, mode=mode)
        with torch.inference_mode():
            rows = kernel_times(fn, x)
        total = sum(us for _, us, _ in rows)
        print(f"torch W4 {mode}: {total:.1f} us of kernels per call")
        for name, us, n in sorted(rows, key=lambda r: -r[1]):
            print(f"  {us:8.1f} us  x{n}  {name[:140]}")


if __name__ == "__main__":
    main()
