// Micro-benchmark of fusebox/backend/cpu/vmath.hpp (the faithful functions and vmath::fast, what
// options::fast_math evaluates) against xsimd's own functions and Eigen 3.4's vectorised ones, one
// thread, in one process: 16M floats from memory, and a row of 4096 floats held in L1 (the
// arithmetic without the memory traffic), medians of 20 rounds after 3 warm-ups each.
//
// Build: g++ -std=c++20 -O3 -march=native -DNDEBUG -Iinclude -I/usr/include/eigen3 bench/vmath.cpp
// Each system gets its best honest configuration: fusebox and xsimd run the same loop (full
// batches of xsimd's default arch, then a scalar tail), Eigen evaluates its own array expression
// (.exp(), .log(), .erf(), .tanh(), .logistic(); EIGEN_FAST_MATH at its default, on) into a
// preallocated array. All read the same aligned input and write the same preallocated, already
// touched output. The systems run in interleaved rounds (warm-up rounds, then timed rounds, each
// round timing every system once), so that load from other processes on a shared machine falls on
// all of them alike. Also printed: each system's max relative and absolute error on the first 2^20
// inputs against a long double reference (the inputs span the ranges tests/cpu/vmath.cpp quotes
// Eigen's errors for: fast_math's contract is Eigen's error or better), and the same loop copying
// the bytes (the memory floor).
//
// Also W1c's body (gelu(x w + b) sigmoid(x)) on one row held in L1, faithful and fast: ns per
// element and each system's largest elementwise relative error; and beside them a floor for any
// exp-based faithful form of it (w1c_exp_floor).
// Output: one JSON object per measurement, then a table of times, ratios and errors (`--w1c`: the
// W1c body's objects alone). Without Eigen on the include path (CMake: link Eigen3::Eigen) the
// Eigen rows are skipped.
#include <fusebox/backend/cpu/vmath.hpp>

#include <xsimd/xsimd.hpp>

#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>
#define FUSEBOX_BENCH_VMATH_EIGEN 1
#else
#define FUSEBOX_BENCH_VMATH_EIGEN 0
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace vm = fusebox::vmath;
using batch = xsimd::batch<float>;
using ld = long double;

constexpr std::size_t n = std::size_t(1) << 24;
constexpr int warmups = 3;
constexpr int runs = 20;
constexpr std::size_t checked = std::size_t(1) << 20;
// The elements a system's run covers: n (from memory), or in_l1 (a row that stays in L1, run
// l1_reps times: the arithmetic without the memory traffic).
constexpr std::size_t in_l1 = 4096;
constexpr int l1_reps = 1024;
std::size_t len = n;

// Kept out of main (noipa: no inlining, no constant propagation of count), so the loop is compiled
// once per function for an unknown count, as in a kernel.
#if defined(__clang__)
#define FUSEBOX_BENCH_OPAQUE [[gnu::noinline]]
#else
#define FUSEBOX_BENCH_OPAQUE [[gnu::noipa]]
#endif
template <class F>
FUSEBOX_BENCH_OPAQUE void elementwise(float const* x, float* y, std::size_t count, F f) {
    std::size_t i = 0;
    for (; i + batch::size <= count; i += batch::size) f(batch::load_aligned(x + i)).store_aligned(y + i);
    for (; i < count; ++i) y[i] = f(x[i]);
}

// xsimd's function on a batch, <cmath>'s on the scalar tail: the xsimd peer's composites.
namespace xsimd_or_std {
template <class V>
V exp(V v) {
    if constexpr (std::is_same_v<V, float>) return std::exp(v);
    else return xsimd::exp(v);
}
template <class V>
V erf(V v) {
    if constexpr (std::is_same_v<V, float>) return std::erf(v);
    else return xsimd::erf(v);
}
}  // namespace xsimd_or_std

struct accuracy {
    double rel = 0, abs = 0;
};

// Relative error against max(|ref|, 1e-30): the tails of gelu (x << 0) count.
accuracy measure(float const* x, float const* y, ld (*ref)(ld)) {
    accuracy a;
    for (std::size_t i = 0; i < checked; ++i) {
        ld const r = ref(ld(x[i]));
        ld const e = std::fabs(ld(y[i]) - r);
        a.abs = std::max(a.abs, double(e));
        a.rel = std::max(a.rel, double(e / std::max(std::fabs(r), ld(1e-30))));
    }
    return a;
}

struct system_run {
    char const* system;
    char const* config;
    std::function<void()> run;
};

struct result {
    std::string fn, system;
    double us;     // from memory, n elements
    double l1_ns;  // per element, in L1
    accuracy acc;
};

std::vector<result> results;

double seconds_of(std::function<void()> const& run) {
    auto const start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

// Median over interleaved rounds of each system's time for `body(s)`, in microseconds.
std::vector<double> medians(std::size_t count, std::function<void(std::size_t)> const& body) {
    std::vector<std::vector<double>> t(count);
    for (int round = 0; round < warmups + runs; ++round)
        for (std::size_t s = 0; s < count; ++s) {
            double const us = seconds_of([&] { body(s); });
            if (round >= warmups) t[s].push_back(us);
        }
    std::vector<double> m;
    for (auto& v : t) {
        std::sort(v.begin(), v.end());
        m.push_back((v[runs / 2 - 1] + v[runs / 2]) / 2);
    }
    return m;
}

void compare(char const* fn, std::vector<system_run> const& systems, float const* x, float const* y,
             ld (*ref)(ld)) {
    len = n;
    std::vector<double> const mem = medians(systems.size(), [&](std::size_t s) { systems[s].run(); });
    len = in_l1;
    std::vector<double> const l1 = medians(systems.size(), [&](std::size_t s) {
        for (int r = 0; r < l1_reps; ++r) systems[s].run();
    });
    len = n;
    for (std::size_t s = 0; s < systems.size(); ++s) {
        systems[s].run();  // its own output, for the accuracy check
        accuracy const acc = ref ? measure(x, y, ref) : accuracy{};
        double const l1_ns = l1[s] * 1e3 / (double(l1_reps) * in_l1);
        results.push_back({fn, systems[s].system, mem[s], l1_ns, acc});
        std::printf(
            "{\"workload\":\"vmath_%s\",\"system\":\"%s\",\"mode\":\"eager\",\"threads\":1,\"n\":%zu,"
            "\"median_us\":%.1f,\"gelem_per_s\":%.3f,\"gbps\":%.2f,\"in_l1_ns_per_elem\":%.4f,"
            "\"max_rel_err\":%.3g,\"max_abs_err\":%.3g,\"config\":\"%s\"}\n",
            fn, systems[s].system, n, mem[s], n / (mem[s] * 1e3), 2.0 * n * sizeof(float) / (mem[s] * 1e3), l1_ns,
            acc.rel, acc.abs, systems[s].config);
    }
}

ld ref_exp(ld v) { return std::exp(v); }
ld ref_log(ld v) { return std::log(v); }
ld ref_erf(ld v) { return std::erf(v); }
ld ref_tanh(ld v) { return std::tanh(v); }
ld ref_gelu(ld v) { return ld(0.5) * v * std::erfc(-v / std::sqrt(ld(2))); }
ld ref_sigmoid(ld v) { return 1 / (1 + std::exp(-v)); }

// W1c's body (BENCHMARKS.md: y = gelu(x w + b) sigmoid(x)) over `count` floats, with the vmath
// functions Gelu and Sigmoid (faithful, or options::fast_math's vmath::fast); t = x w + b is kept
// in `t` so that the accuracy check can start from the same rounded t the system used.
template <class Gelu, class Sigmoid>
FUSEBOX_BENCH_OPAQUE void w1c_fusebox(float const* x, float const* w, float const* b, float* t, float* y,
                                      std::size_t count) {
    constexpr Gelu gelu{};
    constexpr Sigmoid sigmoid{};
    std::size_t i = 0;
    for (; i + batch::size <= count; i += batch::size) {
        batch const xv = batch::load_unaligned(x + i);
        batch const tv = xsimd::fma(xv, batch::load_unaligned(w + i), batch::load_unaligned(b + i));
        tv.store_unaligned(t + i);
        (gelu(tv) * sigmoid(xv)).store_unaligned(y + i);
    }
    for (; i < count; ++i) {
        t[i] = std::fma(x[i], w[i], b[i]);
        y[i] = gelu(t[i]) * sigmoid(x[i]);
    }
}

// A floor for W1c's body in any exp-based faithful form (issue 24's W1c target; docs/benchmarks.md,
// run BC): the arithmetic such a form cannot do without, and less. gelu's Gaussian tail as
// exp(-t^2/2) (the square carried as hi + lo, which its accuracy needs) times a polynomial in
// 1 / (1 + p |t|), and sigmoid's exp(-x), as the faithful functions compute them; but the tail's
// polynomial has 3 terms where the faithful fit (over |t| up to 13.1) has 9, nothing clamps, saturates or handles a
// special value, and without Divide both divisions are multiplications. Its results are not W1c's
// (no error is reported): it times a lower bound.
template <bool Divide>
FUSEBOX_BENCH_OPAQUE void w1c_exp_floor(float const* x, float const* w, float const* b, float* t, float* y,
                                        std::size_t count) {
    namespace d = vm::detail;
    static constexpr std::array<float, 3> tail = {0.28f, 0.21f, 0.14f};
    auto over = [](batch const& num, batch const& den) { return Divide ? num / den : num * den; };
    for (std::size_t i = 0; i + batch::size <= count; i += batch::size) {
        batch const xv = batch::load_unaligned(x + i);
        batch const tv = xsimd::fma(xv, batch::load_unaligned(w + i), batch::load_unaligned(b + i));
        tv.store_unaligned(t + i);
        batch const a = xsimd::abs(tv);
        d::twice<batch> const q = d::scaled_square(a, -0.5f);
        batch const he = d::exp_normal<-1>(q.hi, q.lo);
        batch const u = over(batch(1.f), xsimd::fma(batch(0.265f), a, batch(1.f)));
        batch const g = u * d::horner(u, tail);
        batch const phi = xsimd::select(tv >= batch(0.f), xsimd::fma(-he, g, batch(1.f)), he * g);
        d::exp_parts<batch> const e = d::exp_reduce(-xv);
        batch const ex = xsimd::fma(e.scale, e.p, e.scale);
        over(tv * phi, batch(1.f) + ex).store_unaligned(y + i);
    }
}

#if FUSEBOX_BENCH_VMATH_EIGEN
// bench/peers/eigen_cpu.cpp's row expression for W1c.
FUSEBOX_BENCH_OPAQUE void w1c_eigen(float const* x, float const* w, float const* b, float* t, float* y,
                                    std::size_t count) {
    using cmap = Eigen::Map<const Eigen::ArrayXf>;
    using map = Eigen::Map<Eigen::ArrayXf>;
    cmap const xr(x, Eigen::Index(count)), wr(w, Eigen::Index(count)), br(b, Eigen::Index(count));
    map tr(t, Eigen::Index(count)), yr(y, Eigen::Index(count));
    tr = xr * wr + br;
    yr = (0.5f * tr * (1.0f + (tr * 0.70710678118654752f).erf())) * xr.logistic();
}
#endif

// The W1c body's largest elementwise relative error against long double, from each element's own t.
double w1c_rel_err(float const* x, float const* t, float const* y, std::size_t count) {
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
        ld const r = ref_gelu(ld(t[i])) / (1 + std::exp(-ld(x[i])));
        if (r != 0) worst = std::max(worst, double(std::fabs(ld(y[i]) - r) / std::fabs(r)));
    }
    return worst;
}

// W1c's body on one row of 4096 floats that stays in L1, run `reps` times a round: the arithmetic
// without the memory traffic (docs/benchmarks.md, run AP), fusebox and Eigen in interleaved rounds.
// Inputs as W1c's: x in [-3, 3], w and b in [-1, 1]. The error is over 2^20 such elements.
void w1c_in_cache() {
    constexpr std::size_t row = 4096;
    constexpr int reps = 256;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u3(-3, 3), u1(-1, 1);
    std::vector<float> x(checked), w(checked), b(checked), t(checked), y(checked);
    for (std::size_t i = 0; i < checked; ++i) x[i] = u3(rng), w[i] = u1(rng), b[i] = u1(rng);
    using body = void (*)(float const*, float const*, float const*, float*, float*, std::size_t);
    std::vector<std::pair<char const*, body>> systems{
        {"fusebox", w1c_fusebox<std::remove_cvref_t<decltype(vm::gelu)>, std::remove_cvref_t<decltype(vm::sigmoid)>>},
        {"fast", w1c_fusebox<std::remove_cvref_t<decltype(vm::fast::gelu)>,
                             std::remove_cvref_t<decltype(vm::fast::sigmoid)>>},
        {"floor", w1c_exp_floor<false>},
        {"floor_div", w1c_exp_floor<true>}};
#if FUSEBOX_BENCH_VMATH_EIGEN
    systems.push_back({"eigen", w1c_eigen});
#endif
    std::vector<std::vector<double>> ns(systems.size());
    for (int round = 0; round < warmups + runs; ++round)
        for (std::size_t s = 0; s < systems.size(); ++s) {
            double const us = seconds_of([&] {
                for (int r = 0; r < reps; ++r) systems[s].second(x.data(), w.data(), b.data(), t.data(), y.data(), row);
            });
            if (round >= warmups) ns[s].push_back(us * 1e3 / (double(reps) * row));
        }
    for (std::size_t s = 0; s < systems.size(); ++s) {
        std::sort(ns[s].begin(), ns[s].end());
        systems[s].second(x.data(), w.data(), b.data(), t.data(), y.data(), checked);
        char err[32] = "null";  // the floor computes no W1c
        if (systems[s].second != w1c_exp_floor<false> && systems[s].second != w1c_exp_floor<true>)
            std::snprintf(err, sizeof err, "%.3g", w1c_rel_err(x.data(), t.data(), y.data(), checked));
        std::printf("{\"workload\":\"vmath_w1c_body_in_l1\",\"system\":\"%s\",\"mode\":\"eager\",\"threads\":1,"
                    "\"row\":%zu,\"median_ns_per_elem\":%.4f,\"max_elementwise_rel_err\":%s}\n",
                    systems[s].first, row, (ns[s][runs / 2 - 1] + ns[s][runs / 2]) / 2, err);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 1) {
        if (argc == 2 && std::string(argv[1]) == "--w1c") {  // W1c's body alone, for repeated rounds
            w1c_in_cache();
            return 0;
        }
        std::fprintf(stderr, "bench_vmath: unknown arguments (usage: bench_vmath [--w1c])\n");
        return 2;
    }
#if FUSEBOX_BENCH_VMATH_EIGEN
    Eigen::ArrayXf x(n), y(n);
    float* px = x.data();
    float* py = y.data();
#else
    struct aligned_free {
        void operator()(float* p) const { std::free(p); }
    };
    std::unique_ptr<float, aligned_free> xbuf(static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))));
    std::unique_ptr<float, aligned_free> ybuf(static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))));
    float* px = xbuf.get();
    float* py = ybuf.get();
#endif
    std::fill(py, py + n, 0.f);
    std::mt19937 rng(42);
    auto fill = [&](float lo, float hi) {
        std::uniform_real_distribution<float> u(lo, hi);
        for (std::size_t i = 0; i < n; ++i) px[i] = u(rng);
    };
    // Eigen's entry for one function, or nothing without Eigen.
    auto eigen = [&](char const* config, auto expr) {
        std::vector<system_run> v;
#if FUSEBOX_BENCH_VMATH_EIGEN
        v.push_back({"eigen", config, [&x, &y, expr] { y.head(len) = expr(x.head(len)); }});
#else
        (void)config, (void)expr;
#endif
        return v;
    };
    auto with = [](std::vector<system_run> a, std::vector<system_run> const& b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    };

    char const* fb = "xsimd::batch<float> default arch + scalar tail";
    char const* ff = "same loop, vmath::fast (options::fast_math)";
    char const* xs = "same loop, xsimd 8.1 functions";
    char const* eg = "Eigen 3.4 ArrayXf expression, default EIGEN_FAST_MATH";
    static constexpr float rsqrt2 = 0.70710678118654752f;

    fill(-1, 1);
    compare("copy", {{"limit", "same loop, y = x: the memory floor", [&] {
                          elementwise(px, py, len, [](auto v) { return v; });
                      }}},
            px, py, nullptr);

    // fusebox's faithful and fast functions and xsimd's, each in the same loop over the input.
    auto loops = [&](auto faithful, auto fast, char const* xsimd_config, auto xsimd_fn) {
        auto run = [&](auto f) { return [&px, &py, f] { elementwise(px, py, len, f); }; };
        return std::vector<system_run>{
            {"fusebox", fb, run(faithful)}, {"fast", ff, run(fast)}, {"xsimd", xsimd_config, run(xsimd_fn)}};
    };

    fill(-80, 80);
    compare("exp",
            with(loops([](auto v) { return vm::exp(v); }, [](auto v) { return vm::fast::exp(v); }, xs,
                       [](auto v) { return xsimd::exp(v); }),
                 eigen(eg, [](auto const& a) { return a.exp(); })),
            px, py, ref_exp);

    fill(1e-3f, 1e3f);
    compare("log",
            with(loops([](auto v) { return vm::log(v); }, [](auto v) { return vm::fast::log(v); }, xs,
                       [](auto v) { return xsimd::log(v); }),
                 eigen(eg, [](auto const& a) { return a.log(); })),
            px, py, ref_log);

    fill(-4, 4);
    compare("erf",
            with(loops([](auto v) { return vm::erf(v); }, [](auto v) { return vm::fast::erf(v); }, xs,
                       [](auto v) { return xsimd::erf(v); }),
                 eigen(eg, [](auto const& a) { return a.erf(); })),
            px, py, ref_erf);

    fill(-9, 9);
    compare("tanh",
            with(loops([](auto v) { return vm::tanh(v); }, [](auto v) { return vm::fast::tanh(v); }, xs,
                       [](auto v) { return xsimd::tanh(v); }),
                 eigen(eg, [](auto const& a) { return a.tanh(); })),
            px, py, ref_tanh);

    fill(-80, 20);
    compare("sigmoid",
            with(loops([](auto v) { return vm::sigmoid(v); }, [](auto v) { return vm::fast::sigmoid(v); },
                       "same loop, 1 / (1 + xsimd::exp(-x))",
                       [](auto v) {
                           using V = decltype(v);
                           return V(1.f) / (V(1.f) + xsimd_or_std::exp(-v));
                       }),
                 eigen(eg, [](auto const& a) { return a.logistic(); })),
            px, py, ref_sigmoid);

    fill(-10, 10);
    // gelu: the peers use the textbook 0.5 x (1 + erf(x / sqrt2)) with their own erf.
    compare("gelu",
            with(loops([](auto v) { return vm::gelu(v); }, [](auto v) { return vm::fast::gelu(v); },
                       "same loop, 0.5 x (1 + xsimd::erf(x / sqrt2))",
                       [](auto v) {
                           using V = decltype(v);
                           return V(0.5f) * v * (V(1.f) + xsimd_or_std::erf(v * V(rsqrt2)));
                       }),
                 eigen("0.5 x (1 + (x / sqrt2).erf()) as one Eigen expression",
                       [](auto const& a) { return 0.5f * a * (1.f + (a * rsqrt2).erf()); })),
            px, py, ref_gelu);

    w1c_in_cache();

    std::printf("\nvmath: %zu floats, 1 thread, median of %d interleaved rounds after %d warm-up rounds; "
                "memory floor (copy) %.2f ms\n",
                n, runs, warmups, results.front().us / 1e3);
    std::printf("%-8s %-8s %9s %9s %9s %9s %11s %11s\n", "fn", "system", "ms", "eigen/x", "L1 ns/el", "eigen/x",
                "max rel err", "max abs err");
    for (char const* fn : {"exp", "log", "erf", "tanh", "sigmoid", "gelu"}) {
        result const* eigen = nullptr;
        for (auto const& res : results)
            if (res.fn == fn && res.system == "eigen") eigen = &res;
        for (auto const& res : results) {
            if (res.fn != fn) continue;
            if (eigen)
                std::printf("%-8s %-8s %9.2f %9.2f %9.3f %9.2f %11.2e %11.2e\n", fn, res.system.c_str(),
                            res.us / 1e3, eigen->us / res.us, res.l1_ns, eigen->l1_ns / res.l1_ns, res.acc.rel,
                            res.acc.abs);
            else
                std::printf("%-8s %-8s %9.2f %9s %9.3f %9s %11.2e %11.2e\n", fn, res.system.c_str(), res.us / 1e3,
                            "-", res.l1_ns, "-", res.acc.rel, res.acc.abs);
        }
    }
    return 0;
}
