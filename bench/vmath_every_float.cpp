// fast_math's contract, checked on every float: for each function, vmath::fast and Eigen 3.4's
// vectorised counterpart evaluated on every normal float of a range (both signs), each against
// double's <cmath> function; prints the largest relative and absolute error of each. These are the
// figures tests/cpu/vmath.cpp quotes as Eigen's errors (docs/benchmarks.md, run AU); the test's
// own sweep covers fusebox's side on every build. With --faithful, vmath's default functions alone
// on every float of their ranges: the test samples them, and its samples had missed the worst
// floats of gelu, sigmoid and silu (run AW).
//
// Build: g++ -std=c++20 -O2 -march=native -DNDEBUG -Iinclude -I/usr/include/eigen3
//        bench/vmath_every_float.cpp   (CMake: bench_vmath_every_float, when Eigen is found)
// Usage: bench_vmath_every_float [exp|log|erf|tanh|sigmoid|gelu ...]   (default: all; a few
// minutes of one core, about 4e9 evaluations of each side)
//        bench_vmath_every_float --faithful [exp|log|erf|tanh|sigmoid|silu|gelu ...]   (vmath's default
// functions alone, with ulps: the figures vmath.hpp quotes as "over every float"; 2-4 minutes each)
#include <fusebox/backend/cpu/vmath.hpp>

#include <xsimd/xsimd.hpp>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace vm = fusebox::vmath;
using batch = xsimd::batch<float>;

struct worst {
    double rel = 0, abs = 0, rel_x = 0;
    void add(float x, float y, double ref) {
        if (std::isinf(ref)) return;
        double const d = std::fabs(double(y) - ref);
        abs = std::max(abs, d);
        // Results under 1e-30 count by their absolute error, as in tests/cpu/vmath.cpp.
        double const r = d / std::max(std::fabs(ref), 1e-30);
        if (r > rel) rel = r, rel_x = x;
    }
};

// The floats with bit patterns (u | sign) for u in [u0, min(u0 + count, last + 1)) that lie in
// [lo, hi], into out; returns how many.
std::size_t floats_in(std::uint64_t u0, std::size_t count, std::uint64_t last, std::uint32_t sign, float lo,
                      float hi, float* out) {
    std::size_t n = 0;
    for (std::uint64_t u = u0; u < u0 + count && u <= last; ++u) {
        float x;
        std::uint32_t const bits = std::uint32_t(u) | sign;
        std::memcpy(&x, &bits, sizeof x);
        if (x >= lo && x <= hi) out[n++] = x;
    }
    return n;
}

// Every normal float x with lo <= x <= hi, in blocks: fusebox's batches (a whole number of them per
// block) and Eigen's array expression on the same block.
template <class Fast, class Eigen_fn, class Ref>
void every_float(char const* name, float lo, float hi, Fast fast, Eigen_fn eigen, Ref ref) {
    constexpr std::size_t block = std::size_t(1) << 20;
    Eigen::Index const m = Eigen::Index(block);
    Eigen::ArrayXf xs(m), ye(m), yf(m);
    float* const px = xs.data();
    float* const pf = yf.data();
    float const* const pe = ye.data();
    worst f, e;
    for (std::uint32_t sign : {0u, 0x80000000u}) {
        std::uint64_t const first = 0x00800000u, last = 0x7f7fffffu;  // the positive normal floats
        for (std::uint64_t u0 = first; u0 <= last; u0 += block) {
            std::size_t n = floats_in(u0, block, last, sign, lo, hi, px);
            n -= n % batch::size;
            if (n == 0) continue;
            for (std::size_t i = 0; i < n; i += batch::size)
                fast(batch::load_unaligned(px + i)).store_unaligned(pf + i);
            ye.head(Eigen::Index(n)) = eigen(xs.head(Eigen::Index(n)));
            for (std::size_t i = 0; i < n; ++i) {
                double const r = ref(double(px[i]));
                f.add(px[i], pf[i], r);
                e.add(px[i], pe[i], r);
            }
        }
    }
    std::printf("{\"workload\":\"vmath_every_float_%s\",\"lo\":%g,\"hi\":%g,\"fast_max_rel\":%.3g,"
                "\"fast_max_abs\":%.3g,\"fast_worst_x\":%.9g,\"eigen_max_rel\":%.3g,\"eigen_max_abs\":%.3g,"
                "\"eigen_worst_x\":%.9g}\n",
                name, double(lo), double(hi), f.rel, f.abs, f.rel_x, e.rel, e.abs, e.rel_x);
    std::fflush(stdout);
}

// --faithful: vmath's default (faithful) function alone on every float x with lo <= x <= hi (zero,
// subnormals and normals, both signs), against double: the largest relative error (results under
// 1e-30 by their absolute error), ulps (as tests/cpu/vmath.cpp counts them) and absolute error, and
// where each is reached. The figures vmath.hpp's comments quote as "over every float" (run AW).
template <class Fn, class Ref>
void every_float_faithful(char const* name, float lo, float hi, Fn fn, Ref ref) {
    constexpr std::size_t block = std::size_t(1) << 20;
    std::vector<float> xs(block), ys(block);
    worst w;
    double max_ulp = 0, ulp_x = 0;
    std::size_t wrong_inf = 0;
    for (std::uint32_t sign : {0u, 0x80000000u}) {
        std::uint64_t const last = 0x7f7fffffu;
        for (std::uint64_t u0 = 0; u0 <= last; u0 += block) {
            std::size_t n = floats_in(u0, block, last, sign, lo, hi, xs.data());
            while (n % batch::size) xs[n++] = 0;  // whole batches
            for (std::size_t i = 0; i < n; i += batch::size)
                fn(batch::load_unaligned(xs.data() + i)).store_unaligned(ys.data() + i);
            for (std::size_t i = 0; i < n; ++i) {
                double const r = ref(double(xs[i]));
                // Where the result overflows, it must be the correctly rounded infinity (as the test).
                if (std::isinf(ys[i]) || std::isinf(float(r))) {
                    wrong_inf += ys[i] != float(r);
                    continue;
                }
                w.add(xs[i], ys[i], r);
                if (std::isnan(r)) continue;
                int e = 0;
                std::frexp(std::max(std::fabs(r), double(std::numeric_limits<float>::min())), &e);
                double const ulp = std::ldexp(1.0, e - std::numeric_limits<float>::digits);
                double const u = std::fabs(double(ys[i]) - r) / ulp;
                if (u > max_ulp) max_ulp = u, ulp_x = xs[i];
            }
        }
    }
    std::printf("{\"workload\":\"vmath_every_float_faithful_%s\",\"lo\":%g,\"hi\":%g,\"max_rel\":%.4g,"
                "\"worst_rel_x\":%.9g,\"max_ulp\":%.4g,\"worst_ulp_x\":%.9g,\"max_abs\":%.4g,\"wrong_inf\":%zu}\n",
                name, double(lo), double(hi), w.rel, w.rel_x, max_ulp, ulp_x, w.abs, wrong_inf);
    std::fflush(stdout);
}

int faithful_sweeps(std::vector<std::string> const& want) {
    auto wanted = [&](char const* fn) {
        return want.empty() || std::find(want.begin(), want.end(), fn) != want.end();
    };
    if (wanted("exp"))
        every_float_faithful("exp", -104.0f, 89.0f, [](batch v) { return vm::exp(v); },
                             [](double x) { return std::exp(x); });
    if (wanted("log"))
        every_float_faithful("log", 0.0f, 3.4e38f, [](batch v) { return vm::log(v); },
                             [](double x) { return std::log(x); });
    if (wanted("erf"))
        every_float_faithful("erf", -7.0f, 7.0f, [](batch v) { return vm::erf(v); },
                             [](double x) { return std::erf(x); });
    if (wanted("tanh"))
        every_float_faithful("tanh", -22.0f, 22.0f, [](batch v) { return vm::tanh(v); },
                             [](double x) { return std::tanh(x); });
    if (wanted("sigmoid"))
        every_float_faithful("sigmoid", -110.0f, 110.0f, [](batch v) { return vm::sigmoid(v); },
                             [](double x) { return 1 / (1 + std::exp(-x)); });
    if (wanted("silu"))
        every_float_faithful("silu", -110.0f, 110.0f, [](batch v) { return vm::silu(v); },
                             [](double x) { return x / (1 + std::exp(-x)); });
    if (wanted("gelu"))
        every_float_faithful("gelu", -16.0f, 16.0f, [](batch v) { return vm::gelu(v); },
                             [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); });
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> want(argv + 1, argv + argc);
    if (!want.empty() && want.front() == "--faithful") return faithful_sweeps({want.begin() + 1, want.end()});
    auto wanted = [&](char const* fn) {
        return want.empty() || std::find(want.begin(), want.end(), fn) != want.end();
    };
    static constexpr float rsqrt2 = 0.70710678118654752f;
    if (wanted("exp"))
        every_float("exp", -86.9f, 88.7f, [](batch v) { return vm::fast::exp(v); },
                    [](auto const& a) { return a.exp().eval(); }, [](double x) { return std::exp(x); });
    if (wanted("log"))
        every_float("log", 0.0f, 3.4e38f, [](batch v) { return vm::fast::log(v); },
                    [](auto const& a) { return a.log().eval(); }, [](double x) { return std::log(x); });
    if (wanted("erf"))
        every_float("erf", 0.0f, 4.25f, [](batch v) { return vm::fast::erf(v); },
                    [](auto const& a) { return a.erf().eval(); }, [](double x) { return std::erf(x); });
    if (wanted("tanh"))
        every_float("tanh", -9.5f, 9.5f, [](batch v) { return vm::fast::tanh(v); },
                    [](auto const& a) { return a.tanh().eval(); }, [](double x) { return std::tanh(x); });
    if (wanted("sigmoid"))
        every_float("sigmoid", -80.0f, 20.0f, [](batch v) { return vm::fast::sigmoid(v); },
                    [](auto const& a) { return a.logistic().eval(); },
                    [](double x) { return 1 / (1 + std::exp(-x)); });
    if (wanted("gelu"))
        every_float("gelu", -10.0f, 10.0f, [](batch v) { return vm::fast::gelu(v); },
                    [](auto const& a) { return (0.5f * a * (1.0f + (a * rsqrt2).erf())).eval(); },
                    [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); });
    return 0;
}
