// Tests for include/fusebox/backend/cuda/{driver,memory,module,nvrtc,cublaslt}.hpp on a GPU: memory
// round trips, an NVRTC-compiled kernel launched and checked element by element against a double
// reference, events, a launch with more than 48 KiB of dynamic shared memory, cuBLASLt GEMMs
// (float32 with TF32 off, bfloat16, float16; bias, relu, the tanh GELU; batches; every candidate
// algorithm), and CUDA graph capture and replay.
//
// Every test case first asks `available()` and, on a machine without a GPU (CI), skips saying so.
// Outputs are poisoned (NaN bytes) before each run, every CUDA call is checked, asynchronous
// errors are collected by synchronising the stream, and every element is compared.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fusebox/backend/cuda/cublaslt.hpp"
#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/backend/cuda/nvrtc.hpp"
#include "fusebox/core/errors.hpp"

namespace cuda = fusebox::cuda;
using cuda::CUdeviceptr;

namespace {

/// Skips the test case (with the reason) unless the CUDA backend can run here.
#define FUSEBOX_REQUIRE_CUDA()                                                         \
  do {                                                                                 \
    if (!cuda::available()) {                                                          \
      std::string why;                                                                 \
      try {                                                                            \
        cuda::current_device();                                                        \
      } catch (const std::exception& e) {                                              \
        why = e.what();                                                                \
      }                                                                                \
      WARN("no CUDA device: skipped (" << why << ")");                                 \
      return;                                                                          \
    }                                                                                  \
  } while (false)

constexpr unsigned char poison = 0xFF;  // every float / bf16 / half made of 0xFF bytes is a NaN

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T>
std::span<const T> bytes_of(const std::vector<T>& v) {
  return {v.data(), v.size()};
}

const char* kernels_source = R"(
extern "C" __global__ void saxpy(int n, float a, const float* x, const float* y, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
extern "C" __global__ void scale(int n, float s, float* x) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
// Each block stages `per_block` floats in dynamic shared memory and writes them back reversed.
extern "C" __global__ void reverse_blocks(int per_block, const float* in, float* out) {
  extern __shared__ float staged[];
  const float* src = in + blockIdx.x * per_block;
  float* dst = out + blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) staged[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) dst[i] = staged[per_block - 1 - i];
}
)";

/// The test kernels, compiled once for the device.
const cuda::module& kernels() {
  static const cuda::module m = [] {
    const auto compiled = cuda::nvrtc_compile(kernels_source, "runtime_kernels.cu", cuda::current_device().arch);
    return cuda::module(compiled.cubin, "runtime_kernels");
  }();
  cuda::current_device();
  return m;
}

unsigned blocks_for(std::size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

void launch_saxpy(int n, float a, CUdeviceptr x, CUdeviceptr y, CUdeviceptr out, cuda::CUstream on) {
  void* args[] = {&n, &a, &x, &y, &out};
  cuda::launch(kernels().function("saxpy"), {blocks_for(static_cast<std::size_t>(n), 256)}, {256}, 0,
               on, args, "saxpy");
}

/// Every element of `got` within `tolerance(i)` of `want`; reports the first miss and the count.
template <class Tolerance>
void check_close(const std::vector<float>& got, const std::vector<double>& want, Tolerance tolerance) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isfinite(got[i]) && std::abs(double(got[i]) - want[i]) <= tolerance(i);
    if (!ok && bad++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": got " << got[first] << ", want " << want[first]
                            << ", tolerance " << tolerance(first) << "; " << bad << " of "
                            << got.size() << " elements wrong");
  CHECK(bad == 0);
}

// --- 16-bit storage for cuBLASLt: round to nearest even, as the hardware does ----------------

std::uint16_t to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t(h) << 16); }

std::uint16_t to_f16(float f) {  // finite inputs below 65504 in magnitude
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::abs(double(f));
  if (a < std::ldexp(1.0, -14)) {  // subnormal (or zero): units of 2^-24
    const auto m = static_cast<std::uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
    return static_cast<std::uint16_t>(sign | m);  // m == 1024 is the smallest normal: still right
  }
  int e = std::ilogb(a);
  auto m = static_cast<std::uint32_t>(std::nearbyint((std::ldexp(a, -e) - 1.0) * 1024.0));
  if (m == 1024) m = 0, ++e;
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | m);
}
float from_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return static_cast<float>((h & 0x8000) ? -v : v);
}

/// Host data in the storage type of a cuBLASLt problem, and back.
struct lt_host {
  cuda::lt_type type;
  std::vector<float> values;           // what the device sees, as float (rounded if 16-bit)
  std::vector<unsigned char> storage;  // the bytes to upload

  lt_host(cuda::lt_type t, std::vector<float> v) : type(t), values(std::move(v)) {
    storage.resize(values.size() * cuda::size_of(type));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (type == cuda::lt_type::f32) {
        std::memcpy(&storage[4 * i], &values[i], 4);
        continue;
      }
      const std::uint16_t h = type == cuda::lt_type::bf16 ? to_bf16(values[i]) : to_f16(values[i]);
      values[i] = type == cuda::lt_type::bf16 ? from_bf16(h) : from_f16(h);
      std::memcpy(&storage[2 * i], &h, 2);
    }
  }
  cuda::device_buffer upload() const {
    cuda::device_buffer b(storage.size());
    cuda::copy_to_device(b, bytes_of(storage));
    return b;
  }
};

std::vector<float> download(cuda::lt_type type, const cuda::device_buffer& b, std::size_t n) {
  std::vector<unsigned char> bytes(n * cuda::size_of(type));
  cuda::copy_to_host(std::span<unsigned char>(bytes), b);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (type == cuda::lt_type::f32) {
      std::memcpy(&out[i], &bytes[4 * i], 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = type == cuda::lt_type::bf16 ? from_bf16(h) : from_f16(h);
    }
  }
  return out;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

/// Row-major reference for one lt_problem: value and Σ|a·b| + |bias| (the scale of the rounding
/// error) per element of C, before the activation.
struct gemm_reference {
  std::vector<double> pre, scale;
};
gemm_reference reference_gemm(const cuda::lt_problem& p, const std::vector<float>& a,
                              const std::vector<float>& b, const std::vector<float>& bias) {
  const auto stride = [](std::int64_t s, std::size_t packed) {
    return s == cuda::lt_problem::packed ? packed : static_cast<std::size_t>(s);
  };
  const std::size_t sa = stride(p.stride_a, p.m * p.k), sb = stride(p.stride_b, p.k * p.n),
                    sc = stride(p.stride_c, p.m * p.n);
  gemm_reference r;
  r.pre.assign(sc * (p.batch - 1) + p.m * p.n, 0.0);
  r.scale.assign(r.pre.size(), 0.0);
  for (std::size_t q = 0; q < p.batch; ++q)
    for (std::size_t i = 0; i < p.m; ++i)
      for (std::size_t j = 0; j < p.n; ++j) {
        double sum = p.bias ? bias[j] : 0.0, magnitude = p.bias ? std::abs(bias[j]) : 0.0;
        for (std::size_t k = 0; k < p.k; ++k) {
          const double term = double(a[q * sa + i * p.k + k]) * b[q * sb + k * p.n + j];
          sum += term;
          magnitude += std::abs(term);
        }
        r.pre[q * sc + i * p.n + j] = sum;
        r.scale[q * sc + i * p.n + j] = magnitude;
      }
  return r;
}

/// A stream that frees its cuBLASLt workspace before it goes (lt_release), even when a test
/// fails half-way.
struct lt_stream : cuda::stream {
  lt_stream() = default;
  lt_stream(const lt_stream&) = delete;
  lt_stream& operator=(const lt_stream&) = delete;
  ~lt_stream() {
    try {
      cuda::lt_release(get());
    } catch (...) {
    }
  }
};

/// Owns a captured graph and its executable form.
struct captured_graph {
  cuda::CUgraph graph = nullptr;
  cuda::CUgraphExec exec = nullptr;
  ~captured_graph() {
    if (exec) cuda::driver().graph_exec_destroy(exec);
    if (graph) cuda::driver().graph_destroy(graph);
  }
};

}  // namespace

TEST_CASE("the device is described", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const auto& device = cuda::current_device();
  INFO(device.name << " " << device.arch << ", " << device.sm_count << " SMs, driver "
                   << cuda::driver().version << " at " << cuda::driver().path);
  CHECK(!device.name.empty());
  CHECK(device.sm_major >= 5);
  CHECK(device.arch == "sm_" + std::to_string(device.sm_major) + std::to_string(device.sm_minor));
  CHECK(device.sm_count > 0);
  CHECK(device.max_shared_bytes_optin >= 48 * 1024);
  CHECK(device.context != nullptr);
  CHECK(&cuda::current_device() == &device);  // one process-wide description
}

TEST_CASE("memory round trips: host to device to device to host, sync and async", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const std::size_t bytes = (std::size_t{1} << 20) + 13;  // odd, over a page
  std::vector<unsigned char> host(bytes);
  std::mt19937 gen(std::random_device{}());
  for (auto& b : host) b = static_cast<unsigned char>(gen());

  cuda::device_buffer first(bytes), second(bytes);
  CHECK(first.size() == bytes);
  cuda::copy_to_device(first, bytes_of(host));
  cuda::fill_bytes(second.get(), poison, bytes);
  cuda::copy_on_device(second.get(), first.get(), bytes);
  std::vector<unsigned char> back(bytes, 0xAB);
  cuda::copy_to_host(std::span<unsigned char>(back), second);
  CHECK(std::memcmp(back.data(), host.data(), bytes) == 0);

  // Async through pinned memory on a stream.
  cuda::stream s;
  cuda::pinned_buffer pinned_in(bytes), pinned_out(bytes);
  std::memcpy(pinned_in.data(), host.data(), bytes);
  std::memset(pinned_out.data(), 0xAB, bytes);
  cuda::device_buffer third(bytes);
  cuda::fill_bytes_async(third.get(), poison, bytes, s.get());
  cuda::copy_to_device_async(second.get(), pinned_in.data(), bytes, s.get());
  cuda::copy_on_device_async(third.get(), second.get(), bytes, s.get());
  cuda::copy_to_host_async(pinned_out.data(), third.get(), bytes, s.get());
  s.sync();
  CHECK(std::memcmp(pinned_out.data(), host.data(), bytes) == 0);

  // fill_bytes really writes.
  cuda::fill_bytes(third.get(), 0x5A, bytes);
  cuda::copy_to_host(back.data(), third.get(), bytes);
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char b) { return b == 0x5A; }));

  // Too much data for the buffer is refused by name, before the driver sees it.
  std::vector<unsigned char> too_big(bytes + 1);
  CHECK_THROWS_WITH(cuda::copy_to_device(first, bytes_of(too_big)),
                    Catch::Matchers::Contains(std::to_string(bytes + 1) + " bytes do not fit a device buffer of " +
                                              std::to_string(bytes) + " bytes"));

  // ensure() grows and never shrinks; moves leave the source empty.
  const CUdeviceptr before = first.get();
  first.ensure(16);
  CHECK(first.get() == before);
  CHECK(first.size() == bytes);
  first.ensure(2 * bytes);
  CHECK(first.size() == 2 * bytes);
  cuda::device_buffer moved = std::move(first);
  CHECK(first.empty());
  CHECK(moved.size() == 2 * bytes);
}

TEST_CASE("another thread gets the context made current and can copy", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const auto host = random_floats(1000, 7);
  cuda::device_buffer b(host.size() * sizeof(float));
  cuda::copy_to_device(b, bytes_of(host));
  std::vector<float> back(host.size(), -1.0f);
  std::string error;
  std::thread worker([&] {
    try {
      cuda::copy_to_host(std::span<float>(back), b);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  INFO(error);
  CHECK(error.empty());
  CHECK(back == host);
}

TEST_CASE("an NVRTC kernel launched on random input matches a double reference", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const int n = 1'000'003;
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  const auto x = random_floats(n, seed, -4.0f, 4.0f);
  const auto y = random_floats(n, seed + 1, -4.0f, 4.0f);
  const float a = 1.7f;

  cuda::device_buffer dx(n * sizeof(float)), dy(n * sizeof(float)), dout(n * sizeof(float));
  cuda::copy_to_device(dx, bytes_of(x));
  cuda::copy_to_device(dy, bytes_of(y));
  cuda::stream s;
  cuda::fill_bytes_async(dout.get(), poison, dout.size(), s.get());
  launch_saxpy(n, a, dx.get(), dy.get(), dout.get(), s.get());
  s.sync();  // a fault in the kernel would surface here, as a driver_error

  std::vector<float> out(n);
  cuda::copy_to_host(std::span<float>(out), dout);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = double(a) * x[i] + y[i];
  // One float rounding of a·x (unless contracted to an fma) and one of the sum.
  check_close(out, want, [&](std::size_t i) {
    return 2.5e-7 * (std::abs(double(a) * x[i]) + std::abs(double(y[i]))) + 1e-30;
  });

  // A kernel name the module lacks is an error naming both.
  CHECK_THROWS_WITH(kernels().function("no_such_kernel"),
                    Catch::Matchers::Contains("no_such_kernel") &&
                        Catch::Matchers::Contains("runtime_kernels"));
}

TEST_CASE("events time work on a stream", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const int n = 1 << 22;
  cuda::device_buffer x(n * sizeof(float)), y(n * sizeof(float)), out(n * sizeof(float));
  cuda::fill_bytes(x.get(), 0, x.size());
  cuda::fill_bytes(y.get(), 0, y.size());
  cuda::stream s;
  cuda::event start, stop;
  start.record(s.get());
  for (int i = 0; i < 20; ++i) launch_saxpy(n, 2.0f, x.get(), y.get(), out.get(), s.get());
  stop.record(s.get());
  const float ms = cuda::elapsed_ms(start, stop);
  INFO(ms << " ms for 20 saxpy launches over " << n << " floats");
  CHECK(std::isfinite(ms));
  CHECK(ms > 0.0f);
  CHECK(ms < 10'000.0f);
  s.sync();
}

TEST_CASE("a launch with more than 48 KiB of dynamic shared memory opts in and runs", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const auto& device = cuda::current_device();
  const int per_block = 24 * 1024;  // floats: 96 KiB per block
  const unsigned shared = per_block * sizeof(float);
  if (device.max_shared_bytes_optin < static_cast<int>(shared)) {
    WARN(device.name << " allows only " << device.max_shared_bytes_optin << " bytes per block: skipped");
    return;
  }
  const unsigned blocks = 5;
  const auto in = random_floats(std::size_t{blocks} * per_block, 11);
  cuda::device_buffer din(in.size() * sizeof(float)), dout(in.size() * sizeof(float));
  cuda::copy_to_device(din, bytes_of(in));
  cuda::stream s;
  cuda::fill_bytes_async(dout.get(), poison, dout.size(), s.get());
  int count = per_block;
  CUdeviceptr pin = din.get(), pout = dout.get();
  void* args[] = {&count, &pin, &pout};
  cuda::launch(kernels().function("reverse_blocks"), {blocks}, {256}, shared, s.get(), args,
               "reverse_blocks");
  s.sync();
  std::vector<float> out(in.size());
  cuda::copy_to_host(std::span<float>(out), dout);
  std::vector<double> want(in.size());
  for (unsigned b = 0; b < blocks; ++b)
    for (int i = 0; i < per_block; ++i) want[b * per_block + i] = in[b * per_block + (per_block - 1 - i)];
  check_close(out, want, [](std::size_t) { return 0.0; });

  // More than the device allows is refused by name, before the driver sees it.
  const unsigned too_much = static_cast<unsigned>(device.max_shared_bytes_optin) + 1024;
  CHECK_THROWS_WITH(cuda::launch(kernels().function("reverse_blocks"), {1}, {256}, too_much, s.get(),
                                 args, "reverse_blocks"),
                    Catch::Matchers::Contains("reverse_blocks") &&
                        Catch::Matchers::Contains(std::to_string(too_much)));
}

TEST_CASE("lt_matmul refuses bad problems and pointers before any GPU work", "[cuda]") {
  // Validation runs before cuBLASLt is loaded: this holds on every machine.
  cuda::lt_problem p{.m = 0, .n = 4, .k = 4};
  CHECK_THROWS_AS(cuda::lt_algorithms(p), fusebox::invalid_argument);
  p = {.m = 4, .n = 4, .k = 4, .batch = 2, .stride_c = 3};
  CHECK_THROWS_WITH(cuda::lt_matmul(p, 256, 256, 256, 0, nullptr),
                    Catch::Matchers::Contains("stride_c 3 is below M*N = 16"));
  p = {.m = 4, .n = 4, .k = 4};
  CHECK_THROWS_WITH(cuda::lt_matmul(p, 256, 256, 256 + 4, 0, nullptr),
                    Catch::Matchers::Contains("C pointer") && Catch::Matchers::Contains("not aligned to 256"));
  p.bias = true;
  CHECK_THROWS_WITH(cuda::lt_matmul(p, 256, 256, 512, 0, nullptr),
                    Catch::Matchers::Contains("bias pointer 0 is null"));
  p = {.m = 4, .n = 4, .k = 4, .alignment = 3};
  CHECK_THROWS_AS(cuda::lt_algorithms(p), fusebox::invalid_argument);
}

namespace {

struct lt_case {
  cuda::lt_problem problem;
  double tolerance;  // f32: per element, relative to Σ|a·b| + |bias|; 16-bit: ‖C - ref‖ / ‖ref‖
};

/// Runs `c.problem` on random data (algorithm `algorithm` of the heuristic list; none: the
/// default path's plan; or `chosen` itself where given) and checks C against the double reference
/// of the values the device saw.
void run_lt_case(const lt_case& c, std::optional<std::size_t> algorithm = 0, std::uint32_t seed = 1,
                 const cuda::lt_algorithm* chosen = nullptr) {
  const auto& p = c.problem;
  INFO(cuda::detail::describe(p) << ", algorithm " << (algorithm ? std::to_string(*algorithm) : "default"));
  const auto stride = [](std::int64_t s, std::size_t packed) {
    return s == cuda::lt_problem::packed ? packed : static_cast<std::size_t>(s);
  };
  const std::size_t a_elems = stride(p.stride_a, p.m * p.k) * (p.batch - 1) + p.m * p.k;
  const std::size_t b_elems = stride(p.stride_b, p.k * p.n) * (p.batch - 1) + p.k * p.n;
  const std::size_t c_elems = stride(p.stride_c, p.m * p.n) * (p.batch - 1) + p.m * p.n;
  const lt_host a(p.type, random_floats(a_elems, seed));
  const lt_host b(p.type, random_floats(b_elems, seed + 1));
  const lt_host bias(p.type, random_floats(p.n, seed + 2, -2.0f, 2.0f));
  auto da = a.upload(), db = b.upload(), dbias = bias.upload();
  cuda::device_buffer dc(c_elems * cuda::size_of(p.type));
  lt_stream s;
  cuda::fill_bytes_async(dc.get(), poison, dc.size(), s.get());
  if (chosen)
    cuda::lt_matmul(p, da.get(), db.get(), dc.get(), p.bias ? dbias.get() : 0, s.get(), *chosen);
  else
    cuda::lt_matmul(p, da.get(), db.get(), dc.get(), p.bias ? dbias.get() : 0, s.get(), algorithm);
  s.sync();
  const auto got = download(p.type, dc, c_elems);

  const auto ref = reference_gemm(p, a.values, b.values, bias.values);
  // With a C stride above M*N there are gaps between the matrices: they must keep the poison.
  const std::size_t c_stride = stride(p.stride_c, p.m * p.n);
  std::vector<float> got_inside;
  std::vector<double> want, scale;
  std::size_t gap_written = 0;
  for (std::size_t i = 0; i < ref.pre.size(); ++i) {
    if (i % c_stride >= p.m * p.n) {
      gap_written += std::isnan(got[i]) ? 0 : 1;
      continue;
    }
    const double x = ref.pre[i];
    want.push_back(p.epilogue == cuda::lt_epilogue::relu        ? std::max(x, 0.0)
                   : p.epilogue == cuda::lt_epilogue::gelu_tanh ? gelu_tanh(x)
                                                                : x);
    scale.push_back(ref.scale[i]);
    got_inside.push_back(got[i]);
  }
  CHECK(gap_written == 0);
  if (p.type == cuda::lt_type::f32) {
    check_close(got_inside, want, [&](std::size_t i) { return c.tolerance * scale[i] + 1e-30; });
  } else {
    const auto& got = got_inside;
    double err = 0, norm = 0;
    bool finite = true;
    for (std::size_t i = 0; i < want.size(); ++i) {
      finite = finite && std::isfinite(got[i]);
      err += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    INFO("relative error " << std::sqrt(err / norm));
    CHECK(finite);
    CHECK(std::sqrt(err / norm) < c.tolerance);
  }
}

}  // namespace

TEST_CASE("cuBLASLt float32 (TF32 off) with bias and relu matches a double reference", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  // Odd sizes, so that no dimension is a multiple of a tile. A TF32 product (10-bit mantissa)
  // would miss 1e-5 by two orders of magnitude.
  run_lt_case({{.m = 37, .n = 71, .k = 53, .bias = true, .epilogue = cuda::lt_epilogue::relu}, 1e-5});
  run_lt_case({{.m = 37, .n = 71, .k = 53}, 1e-5});
  run_lt_case({{.m = 1, .n = 1, .k = 1, .bias = true}, 1e-5});
  run_lt_case({{.m = 301, .n = 129, .k = 1031, .bias = true, .epilogue = cuda::lt_epilogue::relu}, 1e-5});
}

TEST_CASE("cuBLASLt bfloat16 and float16 storage with float32 accumulation", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  // Inputs are rounded to 16 bits on the host and the reference uses the rounded values, so
  // the error is the output rounding plus accumulation: bf16 keeps 8 bits, f16 11.
  run_lt_case({{.m = 37, .n = 72, .k = 56, .type = cuda::lt_type::bf16, .bias = true,
                .epilogue = cuda::lt_epilogue::relu}, 1e-2});
  run_lt_case({{.m = 64, .n = 128, .k = 256, .type = cuda::lt_type::bf16}, 1e-2});
  run_lt_case({{.m = 37, .n = 72, .k = 56, .type = cuda::lt_type::f16, .bias = true,
                .epilogue = cuda::lt_epilogue::relu}, 2e-3});
}

TEST_CASE("cuBLASLt batches: packed, and one B shared by every matrix", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  run_lt_case({{.m = 19, .n = 33, .k = 27, .bias = true, .batch = 3}, 1e-5});
  run_lt_case({{.m = 19, .n = 33, .k = 27, .epilogue = cuda::lt_epilogue::relu, .batch = 4,
                .stride_b = 0}, 1e-5});
  run_lt_case({{.m = 16, .n = 32, .k = 8, .batch = 2, .stride_a = 16 * 8 + 64,
                .stride_c = 16 * 32 + 64}, 1e-5});
}

TEST_CASE("every candidate cuBLASLt algorithm gives the right answer", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const lt_case c{{.m = 96, .n = 160, .k = 200, .bias = true, .epilogue = cuda::lt_epilogue::relu}, 1e-5};
  const auto candidates = cuda::lt_algorithms(c.problem, 6);
  REQUIRE(!candidates.empty());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    CHECK(candidates[i].workspace_bytes <= cuda::lt_workspace_bytes);
    run_lt_case(c, i, 100 + static_cast<std::uint32_t>(i));
  }
  CHECK_THROWS_WITH(run_lt_case(c, 1000), Catch::Matchers::Contains("algorithm index 1000"));
}

TEST_CASE("the split-K forms max_autotune adds are offered where few tiles cover C, and are right", "[cuda][autotune]") {
  FUSEBOX_REQUIRE_CUDA();
  // W5's shape in small: few rows, a long K. Each form sums K's parts in float32 in the workspace.
  const lt_case c{{.m = 64, .n = 256, .k = 2048}, 1e-5};
  const auto plain = cuda::lt_algorithms(c.problem, 8);
  const auto all = cuda::lt_algorithms(c.problem, 8, true);
  REQUIRE(all.size() > plain.size());  // cuBLASLt accepts at least one split of its first choices
  for (std::size_t i = plain.size(); i < all.size(); ++i) {
    INFO("split-K form " << i - plain.size());
    CHECK(all[i].workspace_bytes <= cuda::lt_workspace_bytes);
    run_lt_case(c, std::nullopt, 300 + static_cast<std::uint32_t>(i), &all[i]);
  }
}

TEST_CASE("the default path runs a seeded algorithm (a choice stored by an earlier process) without the heuristic",
          "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const lt_case c{{.m = 72, .n = 136, .k = 88, .bias = true}, 1e-5};  // a problem no other case runs
  const auto candidates = cuda::lt_algorithms(c.problem, 4);
  REQUIRE(!candidates.empty());
  CHECK(!cuda::lt_default_algorithm(c.problem));
  // The last candidate, not the heuristic's first: the default path must take what it is given.
  cuda::lt_algorithm stored;
  std::memcpy(&stored.algo, &candidates.back().algo, sizeof stored.algo);  // as read back from disk
  stored.workspace_bytes = candidates.back().workspace_bytes;
  cuda::lt_seed_default_algorithm(c.problem, stored);
  const auto seeded = cuda::lt_default_algorithm(c.problem);
  REQUIRE(seeded);
  CHECK(std::memcmp(&seeded->algo, &candidates.back().algo, sizeof seeded->algo) == 0);
  run_lt_case(c, std::nullopt, 7);
  // A second seed of a known problem changes nothing.
  cuda::lt_seed_default_algorithm(c.problem, candidates.front());
  CHECK(std::memcmp(&cuda::lt_default_algorithm(c.problem)->algo, &candidates.back().algo, sizeof stored.algo) == 0);
}

TEST_CASE("cuBLASLt's GELU epilogue is the tanh approximation", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  // Pre-activations spread over [-4, 4] by the bias, where the tanh and erf forms differ by up
  // to 4.7e-4; products are small so that the GEMM's own error (~1e-7) is negligible.
  cuda::lt_problem p{.m = 64, .n = 96, .k = 16, .bias = true, .epilogue = cuda::lt_epilogue::gelu_tanh};
  const lt_host a(p.type, random_floats(p.m * p.k, 5, -0.25f, 0.25f));
  const lt_host b(p.type, random_floats(p.k * p.n, 6, -0.25f, 0.25f));
  const lt_host bias(p.type, random_floats(p.n, 7, -4.0f, 4.0f));
  auto da = a.upload(), db = b.upload(), dbias = bias.upload();
  cuda::device_buffer dc(p.m * p.n * sizeof(float));
  lt_stream s;
  cuda::fill_bytes_async(dc.get(), poison, dc.size(), s.get());
  cuda::lt_matmul(p, da.get(), db.get(), dc.get(), dbias.get(), s.get());
  s.sync();
  const auto got = download(p.type, dc, p.m * p.n);
  const auto ref = reference_gemm(p, a.values, b.values, bias.values);
  double err_tanh = 0, err_erf = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err_tanh = std::max(err_tanh, std::abs(got[i] - gelu_tanh(ref.pre[i])));
    err_erf = std::max(err_erf, std::abs(got[i] - gelu_erf(ref.pre[i])));
  }
  INFO("max |C - gelu_tanh| = " << err_tanh << ", max |C - gelu_erf| = " << err_erf);
  CHECK(err_tanh < 5e-5);
  CHECK(err_erf > 2e-4);
  CHECK(err_tanh * 4 < err_erf);
}

TEST_CASE("a CUDA graph of kernel launches and a GEMM replays with the same results", "[cuda]") {
  FUSEBOX_REQUIRE_CUDA();
  const auto& api = cuda::driver();
  const int n = 100'003;
  auto x = random_floats(n, 21);
  const auto y = random_floats(n, 22);
  cuda::device_buffer dx(n * sizeof(float)), dy(n * sizeof(float)), dout(n * sizeof(float));
  cuda::copy_to_device(dx, bytes_of(x));
  cuda::copy_to_device(dy, bytes_of(y));

  // The GEMM in the same graph: C[m, n2] = A[m, k] · B[k, n2].
  const cuda::lt_problem p{.m = 33, .n = 65, .k = 17};
  const lt_host a(p.type, random_floats(p.m * p.k, 23));
  const lt_host b(p.type, random_floats(p.k * p.n, 24));
  auto da = a.upload(), db = b.upload();
  cuda::device_buffer dc(p.m * p.n * sizeof(float));

  lt_stream s;
  cuda::lt_prepare(s.get());  // no allocation may happen while the stream is captured
  int count = n;
  float factor = 0.5f;
  CUdeviceptr out = dout.get();
  void* scale_args[] = {&count, &factor, &out};
  const auto scale = kernels().function("scale");
  auto enqueue = [&] {
    launch_saxpy(n, 3.0f, dx.get(), dy.get(), dout.get(), s.get());
    cuda::launch(scale, {blocks_for(n, 256)}, {256}, 0, s.get(), scale_args, "scale");
    cuda::lt_matmul(p, da.get(), db.get(), dc.get(), 0, s.get());
  };

  // Direct run: the expected bits.
  cuda::fill_bytes(dout.get(), poison, dout.size());
  cuda::fill_bytes(dc.get(), poison, dc.size());
  enqueue();
  s.sync();
  std::vector<float> direct(n), direct_c(p.m * p.n);
  cuda::copy_to_host(std::span<float>(direct), dout);
  cuda::copy_to_host(std::span<float>(direct_c), dc);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = 0.5 * (3.0 * x[i] + y[i]);
  check_close(direct, want, [&](std::size_t i) { return 5e-7 * (3.0 * std::abs(x[i]) + std::abs(y[i])); });

  captured_graph g;
  cuda::check(api.stream_begin_capture(s.get(), cuda::CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  try {
    enqueue();
  } catch (...) {
    api.stream_end_capture(s.get(), &g.graph);  // leave the stream usable before failing
    throw;
  }
  cuda::check(api.stream_end_capture(s.get(), &g.graph), "cuStreamEndCapture");
  cuda::check(api.graph_instantiate(&g.exec, g.graph, 0), "cuGraphInstantiateWithFlags");

  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay " << replay);
    cuda::fill_bytes(dout.get(), poison, dout.size());
    cuda::fill_bytes(dc.get(), poison, dc.size());
    cuda::check(api.graph_launch(g.exec, s.get()), "cuGraphLaunch");
    s.sync();
    std::vector<float> replayed(n), replayed_c(p.m * p.n);
    cuda::copy_to_host(std::span<float>(replayed), dout);
    cuda::copy_to_host(std::span<float>(replayed_c), dc);
    CHECK(std::memcmp(replayed.data(), direct.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(replayed_c.data(), direct_c.data(), direct_c.size() * sizeof(float)) == 0);
  }

  // The graph reads the buffers when it runs: new input, new (right) output.
  for (auto& v : x) v = -v;
  cuda::copy_to_device(dx, bytes_of(x));
  cuda::fill_bytes(dout.get(), poison, dout.size());
  cuda::check(api.graph_launch(g.exec, s.get()), "cuGraphLaunch");
  s.sync();
  std::vector<float> fresh(n);
  cuda::copy_to_host(std::span<float>(fresh), dout);
  for (int i = 0; i < n; ++i) want[i] = 0.5 * (3.0 * x[i] + y[i]);
  check_close(fresh, want, [&](std::size_t i) { return 5e-7 * (3.0 * std::abs(x[i]) + std::abs(y[i])); });
}
