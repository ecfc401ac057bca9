"""W4's attention alone in PyTorch, for bench_gpu --only attention: F.scaled_dot_product_attention
(is_causal=True) on bfloat16 [B, 12, 256, 64] at batch 8 and 32, replayed from a CUDA graph (as
fusebox's reduce_overhead), CUDA events around each replay, median of 50 after 10 warm-up calls.

Each backend torch has is timed on its own: its default choice, FlashAttention-2, and cuDNN's
fused attention (the candidate issue 4 asks fusebox to weigh against its own kernel, measured on
the same GPU), and the memory-efficient kernel.

    python3 bench/peers/torch_attention.py
"""
import contextlib

import torch
import torch.nn.functional as F


def backends():
    yield "default", contextlib.nullcontext
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch: the default choice only
        return
    for name, kind in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                       ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        yield name, (lambda kind=kind: sdpa_kernel([kind]))


def time_graph(call):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(10):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(60):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    times = sorted(times[10:])
    return times[len(times) // 2]


def main():
    for batch in (8, 32):
        q, k, v = (torch.randn(batch, 12, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4.0 * batch * 12 * 64 * (256 * 257 / 2)
        reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        for name, context in backends():
            try:
                with context():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    median = time_graph(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            except RuntimeError as e:  # a backend that cannot take these inputs on this GPU
                print(f"attention_b{batch} torch sdpa[{name}]: not available ({str(e).splitlines()[0][:100]})")
                continue
            err = ((out.double() - reference).abs().max() / reference.abs().max()).item()
            print(f"attention_b{batch} torch sdpa[{name}] (CUDA graph) {median:.1f} us, "
                  f"{flops / median / 1e6:.0f} TFLOP/s, max err {err:.1e}")


if __name__ == "__main__":
    main()
