// bench/graph_gap.cu: what a second CUDA graph launch costs on the device, against the same
// kernels in one graph (why bench_gpu's W4 is one compiled function: docs/benchmarks.md, run T).
// Eight kernels of a few microseconds each: one graph, two graphs of four, eight graphs of one,
// and plain stream launches; 100 steps between events, median of 21. Stand-alone, by hand:
//   nvcc -O2 -arch=sm_90 bench/graph_gap.cu -o /tmp/graph_gap && /tmp/graph_gap
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
__global__ void spin(float* p, int n) {  // about `n` dependent FMAs a thread: a few microseconds
  float x = p[threadIdx.x];
  for (int i = 0; i < n; ++i) x = x * 0.999f + 0.001f;
  if (x == 12345.f) p[threadIdx.x] = x;
}
int main() {
  float* p; cudaMalloc(&p, 4096 * 4); cudaMemset(p, 0, 4096 * 4);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  auto capture = [&](int kernels) {
    cudaGraph_t g; cudaGraphExec_t e;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int k = 0; k < kernels; ++k) spin<<<528, 128, 0, s>>>(p, 2000);
    cudaStreamEndCapture(s, &g); cudaGraphInstantiate(&e, g, 0); return e;
  };
  cudaGraphExec_t one = capture(8), half_a = capture(4), half_b = capture(4), single = capture(1);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto time = [&](auto&& step) {
    std::vector<float> v;
    for (int rep = 0; rep < 21; ++rep) {
      for (int w = 0; w < 5; ++w) step();
      cudaEventRecord(a, s);
      for (int i = 0; i < 100; ++i) step();
      cudaEventRecord(b, s); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); v.push_back(ms * 10.f);
    }
    std::sort(v.begin(), v.end()); return v[10];
  };
  for (int round = 0; round < 3; ++round) {
    float t1 = time([&] { cudaGraphLaunch(one, s); });
    float t2 = time([&] { cudaGraphLaunch(half_a, s); cudaGraphLaunch(half_b, s); });
    float t8 = time([&] { for (int k = 0; k < 8; ++k) cudaGraphLaunch(single, s); });
    float tk = time([&] { for (int k = 0; k < 8; ++k) spin<<<528, 128, 0, s>>>(p, 2000); });
    std::printf("8 kernels: one graph %.2f us, two graphs %.2f us (+%.2f), eight graphs %.2f us (+%.2f per extra graph), stream launches %.2f us\n",
                t1, t2, t2 - t1, t8, (t8 - t1) / 7, tk);
  }
}
