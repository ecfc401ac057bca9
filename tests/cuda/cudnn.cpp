// Tests for include/fusebox/backend/cuda/cudnn.hpp and cudnn_attention.hpp: cuDNN is loaded with dlopen
// (or its absence is a clear backend_unavailable); problems it cannot take are refused before it
// is asked; on a GPU, every configuration cuDNN's heuristic offers for fused attention is checked
// element by element against a double reference, in W4's packed qkv layout (q, k and v read in
// place from one [batch, token, 3, head, dim] buffer) and in float16 with as many keys as queries
// or not. The choice between cuDNN and fusebox's kernel under max_autotune is tested with the
// compiled calls (tests/cuda/compiled.cpp).
#include <catch2/catch.hpp>
#include <fusebox/fusebox.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/backend/cuda/cudnn.hpp"
#include "fusebox/backend/cuda/cudnn_attention.hpp"

namespace fb = fusebox;
namespace cuda = fusebox::cuda;

namespace {

/// Host values rounded through the storage type, and their bits for the device.
struct stored {
  std::vector<double> value;
  std::vector<std::uint16_t> bits;
};
stored make_stored(std::size_t n, std::uint64_t seed, bool bf16) {
  stored s;
  std::uint64_t h = seed;
  for (std::size_t i = 0; i < n; ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>((h >> 33) % 4001) / 1000.0f - 2.0f;  // [-2, 2]
    std::uint16_t b;
    double v;
    if (bf16) {
      const auto r = fb::bfloat16::from_float(x);
      b = r.bits;
      v = r.to_float();
    } else {
      const auto r = fb::float16::from_float(x);
      b = r.bits;
      v = r.to_float();
    }
    s.value.push_back(v);
    s.bits.push_back(b);
  }
  return s;
}
double from_bits(std::uint16_t b, bool bf16) {
  if (bf16) {
    fb::bfloat16 r;
    r.bits = b;
    return r.to_float();
  }
  fb::float16 r;
  r.bits = b;
  return r.to_float();
}

/// Element (b, t, h, d) of a strided [batch, token, head, dim] view of `x`.
double at(const std::vector<double>& x, const std::int64_t* s, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
  return x[static_cast<std::size_t>(b * s[0] + t * s[1] + h * s[2] + d * s[3])];
}

}  // namespace

TEST_CASE("cuDNN is loaded with dlopen: version 9 with every function bound, or backend_unavailable naming libcudnn",
          "[cuda][cudnn]") {
  try {
    const cuda::cudnn_api& api = cuda::cudnn();
    CHECK(api.version >= 90000);
    CHECK(api.path.find("libcudnn") != std::string::npos);
    CHECK(api.execute != nullptr);
    CHECK(api.get_last_error_string != nullptr);
  } catch (const fb::backend_unavailable& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("libcudnn"));
    CHECK_THAT(e.what(), Catch::Matchers::Contains("To fix"));
  }
}

TEST_CASE("cudnn_attention_problem: what cuDNN cannot take is refused before cuDNN is asked", "[cuda][cudnn]") {
  cuda::cudnn_attention_problem p;
  p.batch = 2, p.heads = 3, p.tq = 200, p.tk = 200, p.e = 64, p.ev = 64, p.causal = true;
  const std::int64_t packed[4] = {200 * 3 * 3 * 64, 3 * 3 * 64, 64, 1}, plain[4] = {200 * 3 * 64, 3 * 64, 64, 1};
  std::memcpy(p.q, packed, sizeof packed), std::memcpy(p.k, packed, sizeof packed), std::memcpy(p.v, packed, sizeof packed);
  std::memcpy(p.o, plain, sizeof plain);
  CHECK(p.supported());
  auto refused = [&](auto change) {
    cuda::cudnn_attention_problem r = p;
    change(r);
    return !r.supported();
  };
  CHECK(refused([](auto& r) { r.q[3] = 2; }));      // the head dim not contiguous
  CHECK(refused([](auto& r) { r.k[1] = 3 * 64 + 4; }));  // a row stride not a multiple of 8 elements
  CHECK(refused([](auto& r) { r.e = r.ev = 60; }));      // head dims not multiples of 8
  CHECK(refused([](auto& r) { r.e = r.ev = 512; }));     // beyond cuDNN's 256
  CHECK(refused([](auto& r) { r.tk = 100; }));           // causal with fewer keys than queries
  CHECK(!refused([](auto& r) { r.tk = 100, r.causal = false; }));
  // The key names everything that makes two problems different.
  cuda::cudnn_attention_problem other = p;
  other.o[1] = 4 * 64;
  CHECK(other.key() != p.key());
}

TEST_CASE("cuDNN's fused attention: every configuration of its heuristic against a double reference", "[cuda][cudnn]") {
  if (!cuda::available()) {
    WARN("no CUDA device: skipped (the CUDA backend is unavailable here)");
    return;
  }
  try {
    cuda::cudnn();
  } catch (const fb::backend_unavailable& e) {
    WARN("cuDNN is not installed: skipped (" << e.what() << ")");
    return;
  }
  struct case_ {
    const char* name;
    bool bf16, causal, packed;
    std::int64_t batch, tq, tk, heads, e;
    double tolerance;
  };
  // bfloat16: P rounded to bfloat16 for P·V, and the output once; float16 keeps 3 more bits.
  const case_ cases[] = {{"bfloat16, causal, W4's packed qkv layout, a partial last tile", true, true, true, 2, 200, 200, 3, 64, 1.5e-2},
                         {"float16, not causal, fewer queries than keys, head dim 128", false, false, false, 1, 77, 130, 2, 128, 3e-3}};
  for (const case_& c : cases) {
    INFO(c.name);
    cuda::cudnn_attention_problem p;
    p.bf16 = c.bf16, p.causal = c.causal, p.batch = c.batch, p.tq = c.tq, p.tk = c.tk, p.heads = c.heads, p.e = c.e,
    p.ev = c.e;
    const std::int64_t row = c.heads * c.e;
    std::int64_t q_at = 0, k_at = 0, v_at = 0;
    std::size_t q_n, kv_n;
    if (c.packed) {  // one [batch, token, 3, head, dim] buffer
      const std::int64_t s[4] = {c.tq * 3 * row, 3 * row, c.e, 1};
      for (int d = 0; d < 4; ++d) p.q[d] = p.k[d] = p.v[d] = s[d];
      k_at = row, v_at = 2 * row;
      q_n = kv_n = static_cast<std::size_t>(c.batch * c.tq * 3 * row);
    } else {
      const std::int64_t sq[4] = {c.tq * row, row, c.e, 1}, sk[4] = {c.tk * row, row, c.e, 1};
      for (int d = 0; d < 4; ++d) p.q[d] = sq[d], p.k[d] = p.v[d] = sk[d];
      q_n = static_cast<std::size_t>(c.batch * c.tq * row), kv_n = static_cast<std::size_t>(c.batch * c.tk * row);
    }
    const std::int64_t so[4] = {c.tq * row, row, c.e, 1};
    std::memcpy(p.o, so, sizeof so);
    REQUIRE(p.supported());
    const stored qs = make_stored(q_n, 11, c.bf16), ks = c.packed ? qs : make_stored(kv_n, 12, c.bf16),
                 vs = c.packed ? qs : make_stored(kv_n, 13, c.bf16);
    // Reference in double from the stored values.
    const std::size_t o_n = static_cast<std::size_t>(c.batch * c.tq * row);
    std::vector<double> want(o_n, 0.0);
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t i = 0; i < c.tq; ++i) {
          const std::int64_t keys = c.causal ? i + 1 : c.tk;
          std::vector<double> w(static_cast<std::size_t>(keys));
          double mx = -1e300, sum = 0;
          for (std::int64_t j = 0; j < keys; ++j) {
            double d = 0;
            for (std::int64_t e = 0; e < c.e; ++e)
              d += at(qs.value, p.q, b, i, h, e + q_at) * at(ks.value, p.k, b, j, h, e + k_at);
            w[j] = d / std::sqrt(static_cast<double>(c.e));
            mx = std::max(mx, w[j]);
          }
          for (auto& x : w) sum += x = std::exp(x - mx);
          for (std::int64_t e = 0; e < c.e; ++e) {
            double r = 0;
            for (std::int64_t j = 0; j < keys; ++j) r += w[j] / sum * at(vs.value, p.v, b, j, h, e + v_at);
            want[static_cast<std::size_t>(b * so[0] + i * so[1] + h * so[2] + e)] = r;
          }
        }
    double scale = 0;
    for (double x : want) scale = std::max(scale, std::fabs(x));
    cuda::device_buffer dq(q_n * 2), dk(kv_n * 2), dv(kv_n * 2), dout(o_n * 2 + 16);
    cuda::copy_to_device(dq.get(), qs.bits.data(), q_n * 2);
    cuda::copy_to_device(dk.get(), ks.bits.data(), kv_n * 2);
    cuda::copy_to_device(dv.get(), vs.bits.data(), kv_n * 2);
    const cuda::CUdeviceptr q = dq.get(), k = c.packed ? dq.get() + 2 * k_at : dk.get(),
                            v = c.packed ? dq.get() + 2 * v_at : dv.get();
    cuda::cudnn_attention a(p);
    REQUIRE(a.candidates() > 0);
    cuda::stream s;
    auto run_and_check = [&](std::size_t i) {
      CHECK(a.chosen() == static_cast<int>(i));
      cuda::fill_bytes_async(dout.get(), 0xff, o_n * 2, s.get());  // NaN in both types: every element must be written
      REQUIRE(a.run(q, k, v, dout.get(), s.get()));
      s.sync();
      std::vector<std::uint16_t> got(o_n);
      cuda::copy_to_host(got.data(), dout.get(), o_n * 2);
      double worst = 0;
      bool finite = true;
      for (std::size_t j = 0; j < o_n; ++j) {
        const double y = from_bits(got[j], c.bf16);
        finite = finite && std::isfinite(y);
        worst = std::max(worst, std::fabs(y - want[j]) / scale);
      }
      CHECK(finite);
      CHECK(worst < c.tolerance);
    };
    int built = 0, first = -1;
    for (std::size_t i = 0; i < a.candidates(); ++i) {
      INFO("configuration " << i << " of " << a.candidates());
      try {
        a.use(i);
      } catch (const cuda::cudnn_error& e) {
        WARN("configuration " << i << " does not build here: " << e.what());
        continue;
      }
      ++built;
      if (first < 0) first = static_cast<int>(i);
      run_and_check(i);
      // Pointers the graph's 16-byte alignment does not hold are refused, nothing queued.
      CHECK_FALSE(a.run(q, k, v, dout.get() + 2, s.get()));
    }
    if (first >= 0) {  // back to a configuration built before, as a tuner does after timing them all
      INFO("configuration " << first << " again");
      a.use(static_cast<std::size_t>(first));
      a.drop_others();
      run_and_check(static_cast<std::size_t>(first));
    }
    CHECK(built > 0);
  }
}
