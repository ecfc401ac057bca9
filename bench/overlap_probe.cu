// bench/overlap_probe.cu: does AdamW's update, memory-bound, hide under W5's backward GEMMs,
// compute-bound, when it runs on a second stream? Before building the optimizer-in-backward
// path (docs/benchmarks.md, issue 5's W5), this measures what it can gain on the device at hand.
//
// Stream A: W5's backward products after layer 3's weight gradient, float32 without TF32, in
// plan order: dH2 = dY3 W3 (256x4096, K 1024), dW2 = dY2' H1 (4096x4096, K 256), dH1 = dY2 W2
// (256x4096, K 4096), dW1 = dY1' X (4096x1024, K 256). Stream B: an AdamW pass over layers 3 and
// 2's 21 M parameters (the same arithmetic and 28 bytes a parameter as optim/cuda_adamw.hpp).
// Prints A alone, B alone, their sum, and A with B launched beside it, with B's stream at normal
// and at high priority; 20 steps between events, median of 15. Stand-alone, by hand:
//   nvcc -O2 -arch=sm_90 bench/overlap_probe.cu -lcublas -o /tmp/overlap_probe && /tmp/overlap_probe
#include <algorithm>
#include <cstdio>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>

__global__ void adamw(float4* p, const float4* g, float4* m, float4* v, long n4) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
    float4 P = p[i], G = g[i], M = m[i], V = v[i];
    auto one = [](float& p, float g, float& m, float& v) {
      p = p * 0.99999f;
      m = m * 0.9f + g * 0.1f;
      v = v * 0.999f + g * g * 0.001f;
      p = p - 1e-3f * (m / (sqrtf(v) / 0.0316f + 1e-8f));
    };
    one(P.x, G.x, M.x, V.x); one(P.y, G.y, M.y, V.y); one(P.z, G.z, M.z, V.z); one(P.w, G.w, M.w, V.w);
    p[i] = P; m[i] = M; v[i] = V;
  }
}

int main() {
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const long n = 21L << 20;  // ~ layer 3 (4.2 M) + layer 2 (16.8 M) parameters
  float *p, *g, *m, *v;
  for (float** q : {&p, &g, &m, &v}) { cudaMalloc(q, n * 4); cudaMemset(*q, 0, n * 4); }
  float *a, *b, *c;  // operands large enough for every product (16 M floats each)
  for (float** q : {&a, &b, &c}) { cudaMalloc(q, (16L << 20) * 4); cudaMemset(*q, 0, (16L << 20) * 4); }
  int lo, hi; cudaDeviceGetStreamPriorityRange(&lo, &hi);
  cudaStream_t sa, sb, sbh;
  cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking);
  cudaStreamCreateWithPriority(&sb, cudaStreamNonBlocking, lo);
  cudaStreamCreateWithPriority(&sbh, cudaStreamNonBlocking, hi);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, sa);
  cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);  // float32 products, no TF32
  const float one = 1, zero = 0;
  struct mm { int m, n, k; };
  const mm products[] = {{4096, 256, 1024}, {4096, 4096, 256}, {4096, 256, 4096}, {1024, 4096, 256}};
  auto gemms = [&] {
    for (const mm& q : products)
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, q.m, q.n, q.k, &one, a, q.m, b, q.k, &zero, c, q.m);
  };
  int blocks = prop.multiProcessorCount * 4;  // AdamW's grid: every SM four times over, then fewer
  auto update = [&](cudaStream_t s) { adamw<<<blocks, 256, 0, s>>>((float4*)p, (const float4*)g, (float4*)m, (float4*)v, n / 4); };
  cudaEvent_t e0, e1, fork, join; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming); cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  auto time = [&](auto&& step) {
    std::vector<float> t;
    for (int rep = 0; rep < 15; ++rep) {
      for (int w = 0; w < 3; ++w) step();
      cudaEventRecord(e0, sa);
      for (int i = 0; i < 20; ++i) step();
      cudaEventRecord(e1, sa); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000.f / 20);
    }
    std::sort(t.begin(), t.end()); return t[7];
  };
  auto beside = [&](cudaStream_t s) {
    return [&, s] {
      cudaEventRecord(fork, sa); cudaStreamWaitEvent(s, fork, 0);
      gemms();
      update(s);
      cudaEventRecord(join, s); cudaStreamWaitEvent(sa, join, 0);
    };
  };
  for (int round = 0; round < 4; ++round) {
    blocks = prop.multiProcessorCount * 4 >> (2 * round);
    const float ta = time(gemms);
    const float tb = time([&] { update(sa); });
    const float tab = time([&] { update(sa); gemms(); });
    const float tn = time(beside(sb)), th = time(beside(sbh));
    std::printf("AdamW grid %d x 256: GEMMs %.1f us, AdamW %.1f us (%.0f GB/s), one after the other %.1f; "
                "side stream normal priority %.1f, high priority %.1f (hidden: %.0f%% / %.0f%% of AdamW)\n",
                blocks, ta, tb, n * 28.0 / tb / 1e3, tab, tn, th, 100 * (tab - tn) / tb, 100 * (tab - th) / tb);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
