// tests/edge/static_models.cpp: the edge configuration's test program (issue 23). Static models of
// every kind an edge build runs (elementwise chains, reductions, matmul with its epilogues,
// softmax and layer_norm, convolution and pooling, the T2 CNN's forward pass), compiled from
// <fusebox/cpu.hpp> alone, checked element by element against naive double-precision references
// on fresh random inputs; then that nothing is allocated (from start, or once warm), a model on
// the caller's pool, checkpoints read from memory, and that bad input reaches the error handler
// with a message naming the op and the shapes.
//
// It builds without exceptions and RTTI (-fno-exceptions -fno-rtti) and without a test framework,
// so the same source runs on this machine (CTest edge.static_models) and cross-compiled for
// aarch64 under qemu-aarch64 (CTest label aarch64: tests/edge/CMakeLists.txt). Exit status 0 when
// every check passed; each failure prints the model, the element, the value and the reference.
#include <fusebox/cpu.hpp>
#include <fusebox/io/safetensors.hpp>
#include <fusebox/nn/parameters.hpp>

// Without threads fusebox includes none of the threads headers (a toolchain without threads
// support has none): the process-wide state takes core/lock.hpp's lock that does nothing.
#if defined(FUSEBOX_NO_THREADS) && defined(__GLIBCXX__) && \
    (defined(_GLIBCXX_MUTEX) || defined(_GLIBCXX_THREAD) || defined(_GLIBCXX_CONDITION_VARIABLE))
#error "FUSEBOX_NO_THREADS: a fusebox header included <mutex>, <thread> or <condition_variable>"
#endif

#include <atomic>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

// Every heap allocation of the program, counted (the no-heap check below). GCC's
// -Wmismatched-new-delete sees free() of what this operator new returned, which is its pair.
namespace {
std::atomic<long> heap_allocations{0};
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  std::fputs("static_models: out of memory\n", stderr);
  std::abort();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

namespace fb = fusebox;

int checks = 0;
int failures = 0;

/// Every element of `got` against ref(i) (flat row-major index): |got - ref| <= tol * scale(i),
/// with scale 1 + |ref| unless the reference gives one (a sum of |products| for long sums).
template <class T, class S, class Ref, class Scale>
void check_all(const char* what, const fb::tensor<T, S>& got, Ref ref, Scale scale, double tol) {
  ++checks;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double want = ref(i);
    const double g = static_cast<double>(got.data()[i]);
    if (!(std::fabs(g - want) <= tol * scale(i))) {
      std::printf("FAIL %s: element %zu is %.9g, reference %.9g (tolerance %.3g)\n", what, i, g, want, tol * scale(i));
      ++failures;
      return;
    }
  }
  std::printf("ok   %s (%zu elements)\n", what, got.size());
}
template <class T, class S, class Ref>
void check_all(const char* what, const fb::tensor<T, S>& got, Ref ref, double tol) {
  check_all(what, got, ref, [&](std::size_t i) { return 1.0 + std::fabs(ref(i)); }, tol);
}

/// Whether two float tensors hold the same bits.
template <class A, class B>
bool same(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check(const char* what, bool ok) {
  ++checks;
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

double gelu(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }
double sigmoid(double v) { return 1 / (1 + std::exp(-v)); }

/// A warm compiled call into caller-owned outputs allocates nothing (the arena and the workspace
/// are sized by the first call and kept), and gives the same result each time.
template <class F, class Out, class... In>
void check_no_heap(const char* what, F& f, Out&& out, const In&... in) {
  f.run(out, in...);
  const auto& first = [&]() -> const auto& {
    if constexpr (requires { std::get<0>(out); }) return std::get<0>(out);
    else return out;
  }();
  const float first_value = first.data()[first.size() / 2];
  const long before = heap_allocations.load();
  for (int i = 0; i < 3; ++i) f.run(out, in...);
  const long after = heap_allocations.load();
  char line[200];
  std::snprintf(line, sizeof line, "%s: a warm call allocates nothing (%ld allocations) and repeats its result", what,
                after - before);
  check(line, after == before && first.data()[first.size() / 2] == first_value);
}

void elementwise() {
  fb::tensor<float, fb::shape<37, 45>> x, w;
  fb::tensor<float, fb::shape<45>> b;
  x.fill_random(11, -3.0f, 3.0f);
  w.fill_random(12, -1.5f, 1.5f);
  b.fill_random(13, -1.0f, 1.0f);
  auto f = fb::compile([](auto x, auto w, auto b) {
    return fb::gelu(x * w + b) * fb::sigmoid(x) - fb::tanh(x) / 2.0f + fb::exp(fb::relu(w) - 1.0f);
  });
  const auto y = f(x, w, b);
  check_all("elementwise: gelu(x*w+b)*sigmoid(x) - tanh(x)/2 + exp(relu(w)-1)", y, [&](std::size_t i) {
    const double xv = x.data()[i], wv = w.data()[i], bv = b.data()[i % 45];
    return gelu(xv * wv + bv) * sigmoid(xv) - std::tanh(xv) / 2 + std::exp(std::max(wv, 0.0) - 1);
  }, 2e-6);
  fb::tensor<float, fb::shape<37, 45>> out;
  check_no_heap("elementwise", f, out, x, w, b);
  // The counter counts: a call that returns its result allocates it.
  const long before = heap_allocations.load();
  const auto fresh = f(x, w, b);
  check("a call returning a new tensor allocates (the allocation counter counts)",
        heap_allocations.load() > before && fresh.data()[100] == y.data()[100]);
}

/// A vector lane computes what the scalar tail computes, bit for bit, so that no result depends on
/// where a row's tail falls: a compiled division, sigmoid, tanh and silu (each divides), sqrt and
/// rsqrt against the same functions on scalars. AArch64 failed it until vmath's detail::div and
/// detail::sqrt: xsimd 8 divides floats and takes their roots there by estimates and Newton steps.
void lanes_equal_scalar() {
  fb::tensor<float, fb::shape<7, 61>> x, w;  // rows of 61: whole vectors, then a tail
  x.fill_random(31, -9.0f, 9.0f);
  w.fill_random(32, 0.25f, 4.0f);
  const auto q = fb::compile([](auto x, auto w) { return x / w; })(x, w);
  const auto s = fb::compile([](auto x) { return fb::sigmoid(x); })(x);
  const auto t = fb::compile([](auto x) { return fb::tanh(x); })(x);
  const auto u = fb::compile([](auto x) { return fb::silu(x); })(x);
  const auto r = fb::compile([](auto w) { return fb::sqrt(w) + fb::rsqrt(w); })(w);
  int differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x.data()[i];
    differ += q.data()[i] != v / w.data()[i];
    differ += s.data()[i] != fb::vmath::sigmoid(v);
    differ += t.data()[i] != fb::vmath::tanh(v);
    differ += u.data()[i] != fb::vmath::silu(v);
    differ += r.data()[i] != fb::vmath::sqrt(w.data()[i]) + fb::vmath::rsqrt(w.data()[i]);
  }
  char line[200];
  std::snprintf(line, sizeof line,
                "vector lanes equal the scalar tail: x / w, sigmoid, tanh, silu, sqrt + rsqrt (%d of %zu results differ)",
                differ, 5 * x.size());
  check(line, differ == 0);
}

void reductions() {
  fb::tensor<float, fb::shape<29, 70>> x;
  x.fill_random(21, -2.0f, 2.0f);
  auto f = fb::compile([](auto x) {
    return std::make_tuple(fb::sum(x * x, fb::axis<1>), fb::mean(x, fb::axis<0>), fb::max(x, fb::axis<1>));
  });
  const auto [s, m, mx] = f(x);
  auto at = [&](std::size_t r, std::size_t c) { return static_cast<double>(x.data()[r * 70 + c]); };
  check_all("reduction: sum(x*x, axis 1)", s, [&](std::size_t r) {
    double acc = 0;
    for (std::size_t c = 0; c < 70; ++c) acc += at(r, c) * at(r, c);
    return acc;
  }, 1e-6);
  check_all("reduction: mean(x, axis 0)", m, [&](std::size_t c) {
    double acc = 0;
    for (std::size_t r = 0; r < 29; ++r) acc += at(r, c);
    return acc / 29;
  }, [&](std::size_t) { return 2.0; }, 1e-6);
  check_all("reduction: max(x, axis 1)", mx, [&](std::size_t r) {
    double best = at(r, 0);
    for (std::size_t c = 1; c < 70; ++c) best = std::max(best, at(r, c));
    return best;
  }, 0.0);
}

/// a [M,K] @ b [K,N], and the sum of |products| each element's rounding is bounded by.
template <std::size_t M, std::size_t K, std::size_t N>
struct product {
  double value[M * N], bound[M * N];
  product(const float* a, const float* b) {
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double v = 0, s = 0;
        for (std::size_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(a[i * K + k]) * b[k * N + j];
          v += p;
          s += std::fabs(p);
        }
        value[i * N + j] = v;
        bound[i * N + j] = s;
      }
  }
};

void matmul_epilogues() {
  fb::tensor<float, fb::shape<33, 64>> x;
  fb::tensor<float, fb::shape<64, 40>> w;
  fb::tensor<float, fb::shape<40>> b;
  fb::tensor<float, fb::shape<33, 40>> r;
  x.fill_random(31, -1.0f, 1.0f);
  w.fill_random(32, -0.5f, 0.5f);
  b.fill_random(33, -1.0f, 1.0f);
  r.fill_random(34, -1.0f, 1.0f);
  auto f = fb::compile([](auto x, auto w, auto b, auto r) {
    const auto h = fb::matmul(x, w) + b;
    return std::make_tuple(fb::relu(h), fb::gelu(h) + r);
  });
  const auto [y1, y2] = f(x, w, b, r);
  const auto* p = new product<33, 64, 40>(x.data(), w.data());
  auto h = [&](std::size_t i) { return p->value[i] + b.data()[i % 40]; };
  auto scale = [&](std::size_t i) { return 1.0 + p->bound[i] + std::fabs(b.data()[i % 40]); };
  check_all("matmul: relu(x@w + b)", y1, [&](std::size_t i) { return std::max(h(i), 0.0); }, scale, 1e-6);
  check_all("matmul: gelu(x@w + b) + r", y2, [&](std::size_t i) { return gelu(h(i)) + r.data()[i]; },
            [&](std::size_t i) { return scale(i) + std::fabs(r.data()[i]); }, 2e-6);
  delete p;
  fb::tensor<float, fb::shape<33, 40>> o1, o2;
  check_no_heap("matmul with epilogues, two results", f, std::tie(o1, o2), x, w, b, r);
  check("run(std::tie(o1, o2), ...) writes both results",
        std::memcmp(o1.data(), y1.data(), sizeof(float) * o1.size()) == 0 &&
            std::memcmp(o2.data(), y2.data(), sizeof(float) * o2.size()) == 0);
}

void softmax_layer_norm() {
  fb::tensor<float, fb::shape<17, 96>> x;
  fb::tensor<float, fb::shape<96>> g, b;
  x.fill_random(41, -4.0f, 4.0f);
  g.fill_random(42, 0.5f, 1.5f);
  b.fill_random(43, -0.5f, 0.5f);
  auto f = fb::compile([](auto x, auto g, auto b) {
    return std::make_tuple(fb::softmax(x), fb::layer_norm(x, g, b, 1e-5f));
  });
  const auto [sm, ln] = f(x, g, b);
  auto row = [&](std::size_t i) { return x.data() + (i / 96) * 96; };
  check_all("softmax(x)", sm, [&](std::size_t i) {
    const float* v = row(i);
    double mx = v[0], den = 0;
    for (int c = 1; c < 96; ++c) mx = std::max(mx, static_cast<double>(v[c]));
    for (int c = 0; c < 96; ++c) den += std::exp(v[c] - mx);
    return std::exp(x.data()[i] - mx) / den;
  }, 1e-6);
  check_all("layer_norm(x, g, b)", ln, [&](std::size_t i) {
    const float* v = row(i);
    double mean = 0, var = 0;
    for (int c = 0; c < 96; ++c) mean += v[c];
    mean /= 96;
    for (int c = 0; c < 96; ++c) var += (v[c] - mean) * (v[c] - mean);
    var /= 96;
    return (x.data()[i] - mean) / std::sqrt(var + 1e-5) * g.data()[i % 96] + b.data()[i % 96];
  }, 1e-5);
}

/// Naive double convolution [N,C,H,W] * [O,C,K,K] + bias, stride 1, zero padding P.
struct conv_ref {
  std::size_t N, C, H, W, O, K, P;
  double at(const float* x, const float* w, const float* b, std::size_t n, std::size_t o, std::size_t i,
            std::size_t j, double* bound) const {
    double v = b ? b[o] : 0.0, s = b ? std::fabs(b[o]) : 0.0;
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t ki = 0; ki < K; ++ki)
        for (std::size_t kj = 0; kj < K; ++kj) {
          const long ii = static_cast<long>(i + ki) - static_cast<long>(P), jj = static_cast<long>(j + kj) - static_cast<long>(P);
          if (ii < 0 || jj < 0 || ii >= static_cast<long>(H) || jj >= static_cast<long>(W)) continue;
          const double p = static_cast<double>(x[((n * C + c) * H + ii) * W + jj]) * w[((o * C + c) * K + ki) * K + kj];
          v += p;
          s += std::fabs(p);
        }
    if (bound) *bound = s;
    return v;
  }
};

void conv_and_pool() {
  fb::tensor<float, fb::shape<2, 3, 14, 13>> x;
  fb::tensor<float, fb::shape<8, 3, 3, 3>> w;
  fb::tensor<float, fb::shape<8>> b;
  x.fill_random(51, -1.0f, 1.0f);
  w.fill_random(52, -0.5f, 0.5f);
  b.fill_random(53, -0.5f, 0.5f);
  auto f = fb::compile([](auto x, auto w, auto b) {
    const auto c = fb::relu(fb::conv2d<fb::padding<1>>(x, w, b));
    return std::make_tuple(c, fb::max_pool2d<2>(c), fb::avg_pool2d<2>(c));
  });
  const auto [c, mp, ap] = f(x, w, b);
  const conv_ref cr{2, 3, 14, 13, 8, 3, 1};
  auto conv_at = [&](std::size_t n, std::size_t o, std::size_t i, std::size_t j, double* bound = nullptr) {
    return std::max(cr.at(x.data(), w.data(), b.data(), n, o, i, j, bound), 0.0);
  };
  check_all("conv2d 3x3 padding 1, bias, relu", c, [&](std::size_t e) {
    return conv_at(e / (8 * 14 * 13), e / (14 * 13) % 8, e / 13 % 14, e % 13);
  }, [&](std::size_t e) {
    double s = 0;
    conv_at(e / (8 * 14 * 13), e / (14 * 13) % 8, e / 13 % 14, e % 13, &s);
    return 1.0 + s;
  }, 1e-6);
  // Pools over the relu'd convolution fusebox computed (checked above): their own arithmetic only.
  auto pooled = [&](std::size_t e, bool max) {
    const std::size_t n = e / (8 * 7 * 6), o = e / (7 * 6) % 8, i = e / 6 % 7, j = e % 6;
    double best = -1e300, sum = 0;
    for (std::size_t di = 0; di < 2; ++di)
      for (std::size_t dj = 0; dj < 2; ++dj) {
        const double v = c.data()[((n * 8 + o) * 14 + 2 * i + di) * 13 + 2 * j + dj];
        best = std::max(best, v);
        sum += v;
      }
    return max ? best : sum / 4;
  };
  check_all("max_pool2d<2>", mp, [&](std::size_t e) { return pooled(e, true); }, 0.0);
  check_all("avg_pool2d<2>", ap, [&](std::size_t e) { return pooled(e, false); }, 1e-7);
}

/// BENCHMARKS.md's T2 network (examples/fashion_cnn.hpp), its forward pass at batch 2:
/// [2,1,28,28] -> conv 5x5 32, relu, max-pool 2 -> conv 5x5 64, relu, max-pool 2 -> linear 1024 -> 10.
// Bad input: with exceptions the error is thrown; without, it reaches the error handler, which
// must not return. This one records the message and jumps back (the test's way of not returning).
std::jmp_buf after_error;
char error_message[512];

/// The message of the error `call` raises ("" if none).
template <class Call>
std::string message_of(Call&& call) {
  fb::set_error_handler([](const std::exception& e) {
    std::snprintf(error_message, sizeof error_message, "%s", e.what());
    std::longjmp(after_error, 1);
  });
  error_message[0] = '\0';
#if FUSEBOX_HAS_EXCEPTIONS
  try {
    call();
  } catch (const fb::error& e) {
    std::snprintf(error_message, sizeof error_message, "%s", e.what());
  }
#else
  if (setjmp(after_error) == 0) call();
#endif
  fb::set_error_handler(nullptr);
  std::printf("     the error: %s\n", error_message);
  return std::string(error_message);
}

void t2_cnn_forward() {
  fb::tensor<float, fb::shape<2, 1, 28, 28>> x;
  fb::tensor<float, fb::shape<32, 1, 5, 5>> w1;
  fb::tensor<float, fb::shape<32>> b1;
  fb::tensor<float, fb::shape<64, 32, 5, 5>> w2;
  fb::tensor<float, fb::shape<64>> b2;
  fb::tensor<float, fb::shape<1024, 10>> w3;
  fb::tensor<float, fb::shape<10>> b3;
  x.fill_random(61, 0.0f, 1.0f);
  w1.fill_random(62, -0.2f, 0.2f);
  b1.fill_random(63, -0.2f, 0.2f);
  w2.fill_random(64, -0.035f, 0.035f);
  b2.fill_random(65, -0.035f, 0.035f);
  w3.fill_random(66, -0.03f, 0.03f);
  b3.fill_random(67, -0.03f, 0.03f);
  const auto t2 = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
    const auto h1 = fb::max_pool2d<2>(fb::relu(fb::conv2d(x, w1, b1)));
    const auto h2 = fb::max_pool2d<2>(fb::relu(fb::conv2d(h1, w2, b2)));
    return fb::matmul(fb::reshape<fb::shape<2, 1024>>(h2), w3) + b3;
  };
  auto net = fb::compile(t2);
  const auto logits = net(x, w1, b1, w2, b2, w3, b3);

  // The reference in double, layer by layer, with the bound of each logit's rounding carried
  // through (relu and max pass a value's bound on).
  std::vector<double> a1(2 * 32 * 12 * 12), s1(a1.size()), a2(2 * 64 * 4 * 4), s2(a2.size());
  const conv_ref c1{2, 1, 28, 28, 32, 5, 0};
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t o = 0; o < 32; ++o)
      for (std::size_t i = 0; i < 12; ++i)
        for (std::size_t j = 0; j < 12; ++j) {
          double best = 0, bound = 0;  // relu then max: max(0, conv values)
          for (std::size_t d = 0; d < 4; ++d) {
            double s = 0;
            const double v = c1.at(x.data(), w1.data(), b1.data(), n, o, 2 * i + d / 2, 2 * j + d % 2, &s);
            if (v > best) best = v;
            bound = std::max(bound, s);
          }
          a1[((n * 32 + o) * 12 + i) * 12 + j] = best;
          s1[((n * 32 + o) * 12 + i) * 12 + j] = bound;
        }
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t o = 0; o < 64; ++o)
      for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j) {
          double best = 0, bound = 0;
          for (std::size_t d = 0; d < 4; ++d) {
            // From the double activations; each term's bound adds the first layer's (s1).
            double v = b2.data()[o], s = std::fabs(b2.data()[o]);
            for (std::size_t c = 0; c < 32; ++c)
              for (std::size_t ki = 0; ki < 5; ++ki)
                for (std::size_t kj = 0; kj < 5; ++kj) {
                  const std::size_t at = ((n * 32 + c) * 12 + 2 * i + d / 2 + ki) * 12 + 2 * j + d % 2 + kj;
                  const double wv = w2.data()[((o * 32 + c) * 5 + ki) * 5 + kj];
                  v += a1[at] * wv;
                  s += (std::fabs(a1[at]) + s1[at]) * std::fabs(wv);
                }
            if (v > best) best = v;
            bound = std::max(bound, s);
          }
          a2[((n * 64 + o) * 4 + i) * 4 + j] = best;
          s2[((n * 64 + o) * 4 + i) * 4 + j] = bound;
        }
  check_all("T2 CNN forward, batch 2 (conv 5x5 32, relu, pool, conv 5x5 64, relu, pool, linear 1024->10)", logits,
            [&](std::size_t e) {
              const std::size_t n = e / 10, k = e % 10;
              double v = b3.data()[k];
              for (std::size_t f = 0; f < 1024; ++f) v += a2[n * 1024 + f] * w3.data()[f * 10 + k];
              return v;
            },
            [&](std::size_t e) {
              const std::size_t n = e / 10, k = e % 10;
              double s = 1 + std::fabs(b3.data()[k]);
              for (std::size_t f = 0; f < 1024; ++f) s += (std::fabs(a2[n * 1024 + f]) + s2[n * 1024 + f]) * std::fabs(w3.data()[f * 10 + k]);
              return s;
            },
            1e-5);
  fb::tensor<float, fb::shape<2, 10>> out;
  check_no_heap("T2 CNN forward", net, out, x, w1, b1, w2, b2, w3, b3);

  // options::freezing, in the caller's memory: the parameters captured, the second convolution's
  // Winograd weights made at the first call and kept. The same bits as the call that makes them
  // every time; kept while w2 changes in place (that is what freezing promises, and what makes it
  // fast), made again after refreeze().
  auto frozen = fb::compile<fb::options{.freezing = true}>([&](auto xi) { return t2(xi, w1, b1, w2, b2, w3, b3); });
  static fb::static_memory<decltype(frozen), 1, decltype(x)> frozen_memory;
  frozen.use_memory(frozen_memory.span());
  fb::tensor<float, fb::shape<2, 10>> kept, stale, fresh, changed;
  const long before = heap_allocations.load();
  frozen.run(kept, x);
  frozen.run(kept, x);
  const long allocations = heap_allocations.load() - before;
  char line[200];
  std::snprintf(line, sizeof line, "T2 CNN frozen in the caller's memory (%zu bytes): the same bits, %ld allocations",
                frozen_memory.size, allocations);
  check(line, same(kept, out) && allocations == 0 &&
                  frozen_memory.size > decltype(net)::memory_bytes<decltype(x), decltype(w1), decltype(b1), decltype(w2),
                                                                   decltype(b2), decltype(w3), decltype(b3)>(1));
  w2.data()[w2.size() / 3] += 0.25f;
  frozen.run(stale, x);
  net.run(changed, x, w1, b1, w2, b2, w3, b3);
  frozen.refreeze();
  frozen.run(fresh, x);
  check("T2 CNN frozen: w2 changed in place is not seen until refreeze(), then it is",
        same(stale, kept) && !same(changed, kept) && same(fresh, changed));
  // Memory sized without the kept weights: an error naming them and both sizes; nothing written.
  static fb::static_memory<decltype(net), 1, decltype(x), decltype(w1), decltype(b1), decltype(w2), decltype(b2),
                           decltype(w3), decltype(b3)>
      unfrozen_memory;  // the same model's size without freezing: short by the kept weights' index at least
  frozen.use_memory(unfrozen_memory.span());
  fb::tensor<float, fb::shape<2, 10>> untouched;
  untouched.fill_random(68, -1.0f, 1.0f);
  const float before_value = untouched.data()[3];
  const std::string msg = message_of([&] { frozen.run(untouched, x); });
  check("frozen, memory short of the kept weights: an error naming them and both sizes, nothing written",
        msg.find("frozen weights") != std::string::npos && msg.find("memory_bytes") != std::string::npos &&
            msg.find(std::to_string(unfrozen_memory.size) + " bytes") != std::string::npos &&
            untouched.data()[3] == before_value);
}

/// options::freezing on a one-row matmul: B's column blocks packed at the first call and kept
/// (backend/cpu/gemm.hpp's pack_gemv_blocks); the same bits as the plain call, kept while w changes
/// in place, packed again after refreeze().
void frozen_gemv() {
  fb::tensor<float, fb::shape<1, 300>> x;
  fb::tensor<float, fb::shape<300, 200>> w;
  fb::tensor<float, fb::shape<200>> b;
  x.fill_random(71, -1.0f, 1.0f);
  w.fill_random(72, -0.1f, 0.1f);
  b.fill_random(73, -0.5f, 0.5f);
  const auto layer = [](auto x, auto w, auto b) { return fb::relu(fb::matmul(x, w) + b); };
  auto plain = fb::compile(layer);
  auto frozen = fb::compile<fb::options{.freezing = true}>([&](auto xi) { return layer(xi, w, b); });
  fb::tensor<float, fb::shape<1, 200>> y, kept, stale, fresh, changed;
  plain.run(y, x, w, b);
  frozen.run(kept, x);
  const product<1, 300, 200> p(x.data(), w.data());
  check_all("frozen one-row matmul: relu(x@w + b), 1x300 @ 300x200", kept,
            [&](std::size_t j) { return std::max(p.value[j] + b.data()[j], 0.0); }, 1e-5);
  w.data()[7 * 200 + 50] += 0.5f;  // in the first packed block (columns past the last whole one are read in place)
  frozen.run(stale, x);
  plain.run(changed, x, w, b);
  frozen.refreeze();
  frozen.run(fresh, x);
  check("frozen one-row matmul: the same bits as the plain call; w changed in place not seen until refreeze()",
        same(kept, y) && same(stale, kept) && !same(changed, kept) && same(fresh, changed));
}

/// The caller's thread pool (options::pool) in place of fusebox's. This one has no threads (the
/// edge build may have none): it runs every task itself, last first, naming three workers in turn,
/// and counts what it was given; cpu.thread_pool tests one with real threads.
struct callers_pool {
  std::size_t jobs = 0, tasks = 0;
  static void parallel_for(void* self, std::size_t n, fb::cpu::task_ref task) {
    auto& pool = *static_cast<callers_pool*>(self);
    ++pool.jobs;
    pool.tasks += n;
    for (std::size_t t = n; t-- > 0;) task(t, static_cast<unsigned>(t % 3));
  }
};

void on_callers_pool() {
  fb::tensor<float, fb::shape<96, 256>> x;
  fb::tensor<float, fb::shape<256, 80>> w;
  fb::tensor<float, fb::shape<80>> b;
  x.fill_random(81, -1.0f, 1.0f);
  w.fill_random(82, -0.25f, 0.25f);
  b.fill_random(83, -1.0f, 1.0f);
  callers_pool state;
  const fb::cpu::external_pool pool{3, &state, &callers_pool::parallel_for};
  auto f = fb::compile([](auto x, auto w, auto b) { return fb::softmax(fb::gelu(fb::matmul(x, w) + b)); },
                       {.pool = &pool});
  const auto y = f(x, w, b);
  const auto* p = new product<96, 256, 80>(x.data(), w.data());
  std::vector<double> want(96 * 80);
  for (std::size_t i = 0; i < 96; ++i) {
    double den = 0;
    for (std::size_t j = 0; j < 80; ++j) den += std::exp(gelu(p->value[i * 80 + j] + b.data()[j]));
    for (std::size_t j = 0; j < 80; ++j) want[i * 80 + j] = std::exp(gelu(p->value[i * 80 + j] + b.data()[j])) / den;
  }
  delete p;
  // softmax's inputs carry the GEMM's rounding (K = 256): ~1e-5 relative to |products| at most.
  check_all("on the caller's pool: softmax(gelu(x@w + b)), 96x256 @ 256x80", y, [&](std::size_t i) { return want[i]; },
            2e-5);
  char line[160];
  std::snprintf(line, sizeof line, "on the caller's pool: it ran %zu jobs of %zu tasks, and f.threads() is 3", state.jobs,
                state.tasks);
  check(line, state.jobs > 0 && state.tasks > state.jobs && f.threads() == 3);
}

// Nothing allocated at all: the tensors over the program's own arrays (one of them 4 bytes past
// a cache line), the compiled function's memory in a static_memory, counted from before compile()
// in a process that has run nothing else (main calls this first: what a first call sets up once,
// such as the profiler's state, would be missed after other models ran).
alignas(64) float own_img[2 * 3 * 10 * 10 + 1];
alignas(64) float own_k[4 * 3 * 3 * 3];
alignas(64) float own_x[16 * 32];
alignas(64) float own_w[32 * 24];
alignas(64) float own_b[24];
alignas(64) float own_pooled[2 * 4 * 4 * 4];
alignas(64) float own_out[16 * 24];

void nothing_allocated() {
  const long before = heap_allocations.load();
  auto img = fb::tensor<float, fb::shape<2, 3, 10, 10>>::over(own_img + 1);
  auto k = fb::tensor<float, fb::shape<4, 3, 3, 3>>::over(own_k);
  auto x = fb::tensor<float, fb::shape<16, 32>>::over(own_x);
  auto w = fb::tensor<float, fb::shape<32, 24>>::over(own_w);
  auto b = fb::tensor<float, fb::shape<24>>::over(own_b);
  auto pooled = fb::tensor<float, fb::shape<2, 4, 4, 4>>::over(own_pooled);
  auto out = fb::tensor<float, fb::shape<16, 24>>::over(own_out);
  img.fill_random(90, -1.0f, 1.0f);
  k.fill_random(94, -0.5f, 0.5f);
  x.fill_random(91, -1.0f, 1.0f);
  w.fill_random(92, -0.5f, 0.5f);
  b.fill_random(93, -1.0f, 1.0f);
  auto f = fb::compile([](auto x, auto w, auto b) { return fb::softmax(fb::gelu(fb::matmul(x, w) + b)); });
  auto g = fb::compile([](auto img, auto k) { return fb::max_pool2d<2>(fb::relu(fb::conv2d(img, k))); });
  static fb::static_memory<decltype(f), 1, decltype(x), decltype(w), decltype(b)> memory;
  static fb::static_memory<decltype(g), 1, decltype(img), decltype(k)> conv_memory;
  f.use_memory(memory.span());
  g.use_memory(conv_memory.span());
  for (int i = 0; i < 3; ++i) {
    f.run(out, x, w, b);
    g.run(pooled, img, k);
  }
  const long allocations = heap_allocations.load() - before;

  const product<16, 32, 24> p(x.data(), w.data());
  check_all("in the caller's memory: softmax(gelu(x@w + b))", out, [&](std::size_t i) {
    const std::size_t r = i / 24;
    double den = 0;
    for (std::size_t j = 0; j < 24; ++j) den += std::exp(gelu(p.value[r * 24 + j] + b.data()[j]));
    return std::exp(gelu(p.value[i] + b.data()[i % 24])) / den;
  }, 1e-5);
  const conv_ref cr{2, 3, 10, 10, 4, 3, 0};
  check_all("in the caller's memory: max_pool2d(relu(conv2d)), the image not 64-byte aligned", pooled,
            [&](std::size_t e) {
              const std::size_t n = e / 64, o = e / 16 % 4, i = e / 4 % 4, j = e % 4;
              double best = 0;  // relu, then the max of the window
              for (std::size_t d = 0; d < 4; ++d)
                best = std::max(best, cr.at(img.data(), k.data(), nullptr, n, o, 2 * i + d / 2, 2 * j + d % 2, nullptr));
              return best;
            },
            1e-5);
  char line[200];
  std::snprintf(line, sizeof line,
                "nothing allocated: tensors over, two compile()s, use_memory (%zu and %zu bytes) and three calls each "
                "made %ld allocations",
                memory.size, conv_memory.size, allocations);
  check(line, allocations == 0 && f.threads() == 1);

  // Memory too small for the call: an error naming both sizes, and nothing written to out.
  const float kept = out.data()[7];
  f.use_memory(memory.span().first(memory.size / 2));
  const std::string msg = message_of([&] { f.run(out, x, w, b); });
  check("use_memory with half the bytes: the call is an error naming both sizes",
        msg.find("use_memory") != std::string::npos &&
            msg.find(std::to_string(memory.size / 2) + " bytes") != std::string::npos &&
            msg.find("needs " + std::to_string(memory.size)) != std::string::npos && out.data()[7] == kept);
}

/// A safetensors checkpoint in memory, as an edge program reads one (no std::filesystem): F32
/// tensors "a" of shape a_shape and "b" of shape b_shape, element i of the buffer = i + 0.5.
std::vector<std::byte> checkpoint(const std::string& a_shape, std::size_t a_count, const std::string& b_shape,
                                  std::size_t b_count) {
  std::string header = "{\"a\":{\"dtype\":\"F32\",\"shape\":" + a_shape + ",\"data_offsets\":[0," +
                       std::to_string(4 * a_count) + "]},\"b\":{\"dtype\":\"F32\",\"shape\":" + b_shape +
                       ",\"data_offsets\":[" + std::to_string(4 * a_count) + "," +
                       std::to_string(4 * (a_count + b_count)) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::byte> bytes(8 + header.size() + 4 * (a_count + b_count));
  for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < a_count + b_count; ++i) {
    const float v = static_cast<float>(i) + 0.5f;  // little-endian on both machines this runs on
    std::memcpy(bytes.data() + 8 + header.size() + 4 * i, &v, 4);
  }
  return bytes;
}

void checkpoints() {
  fb::tensor<float, fb::shape<2, 3>> a;
  fb::tensor<float, fb::shape<4>> b;
  fb::nn::parameter_list<float> params;
  params.add("a", a);
  params.add("b", b);
  fb::io::load_safetensors(fb::io::parse_safetensors(checkpoint("[2,3]", 6, "[4]", 4), "good.safetensors"),
                           "good.safetensors", params);
  check("a checkpoint read from memory loads every tensor", a(1, 2) == 5.5f && b(3) == 9.5f);
  // "b" is [5] in this file: an error naming the tensor and both shapes, and "a", which fits, is
  // not written either.
  a.fill_random(99);
  const float kept = a(0, 1);
  const std::string msg = message_of([&] {
    fb::io::load_safetensors(fb::io::parse_safetensors(checkpoint("[2,3]", 6, "[5]", 5), "bad.safetensors"),
                             "bad.safetensors", params);
  });
  check("a checkpoint whose tensor does not fit: an error naming it and both shapes, nothing loaded",
        msg.find("'b'") != std::string::npos && msg.find("[5]") != std::string::npos &&
            msg.find("[4]") != std::string::npos && a(0, 1) == kept);
}

void bad_input() {
  // Each call below is an error; the message it raised is checked for the op and the shapes.
  fb::tensor<float, fb::shape<6, 4>> x;
  x.fill_random(71);
  std::string msg = message_of([&] { (void)x.at(6, 0); });
  check("bad input: at(6, 0) of a [6, 4] tensor names the index, the dimension and the shape",
        msg.find("index 6") != std::string::npos && msg.find("dimension 0") != std::string::npos &&
            msg.find("[6, 4]") != std::string::npos);
  // Extents known at run time (a batch read from a file, say): the message names this line.
  fb::tensor<float, fb::shape<fb::dyn, 4>> rows(fb::dims{2, {6, 4}});
  msg = message_of([&] { (void)rows.reshape<fb::shape<5, 5>>(); });
  check("bad input: reshape of [6, 4] to [5, 5] names the op, both shapes and the caller's line",
        msg.find("reshape") != std::string::npos && msg.find("[6, 4]") != std::string::npos &&
            msg.find("[5, 5]") != std::string::npos && msg.find("static_models.cpp:") != std::string::npos);
}

}  // namespace

int main() {
  std::printf("fusebox edge configuration: exceptions %s, %s\n", FUSEBOX_HAS_EXCEPTIONS ? "on" : "off",
#if defined(__aarch64__)
              "aarch64"
#elif defined(__x86_64__)
              "x86-64"
#else
              "another architecture"
#endif
  );
  nothing_allocated();  // first: see its comment
  elementwise();
  lanes_equal_scalar();
  reductions();
  matmul_epilogues();
  softmax_layer_norm();
  conv_and_pool();
  t2_cnn_forward();
  frozen_gemv();
  on_callers_pool();
  checkpoints();
  bad_input();
  std::printf("%d of %d checks passed\n", checks - failures, checks);
  return failures == 0 ? 0 : 1;
}
