"""W4's attention alone in PyTorch, for bench_gpu --only attention: F.scaled_dot_product_attention
(is_causal=True) on bfloat16 [B, 12, 256, 64] at batch 8 and 32, replayed from a CUDA graph (as
fusebox's reduce_overhead), CUDA events around each replay, median of 50 after 10 warm-up calls.

    python3 bench/peers/torch_attention.py
"""
import torch
import torch.nn.functional as F


def main():
    for batch in (8, 32):
        q, k, v = (torch.randn(batch, 12, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(10):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(60):
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1000.0)
        times = sorted(times[10:])
        flops = 4.0 * batch * 12 * 64 * (256 * 257 / 2)
        median = times[len(times) // 2]
        print(f"attention_b{batch} torch sdpa (CUDA graph) {median:.1f} us, {flops / median / 1e6:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
