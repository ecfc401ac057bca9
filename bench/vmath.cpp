// Micro-benchmark of fusebox/backend/cpu/vmath.hpp against xsimd's own functions and Eigen 3.4's
// vectorised ones: 16M floats, one thread, median of 20 runs after 3 warm-ups, in one process.
//
// Build: g++ -std=c++20 -O3 -march=native -DNDEBUG -Iinclude -I/usr/include/eigen3 bench/vmath.cpp
// Each system gets its best honest configuration: fusebox and xsimd run the same loop (full
// batches of xsimd's default arch, then a scalar tail), Eigen evaluates its own array expression
// (.exp(), .log(), .erf(), .tanh(); EIGEN_FAST_MATH at its default, on) into a preallocated array.
// All read the same aligned input and write the same preallocated, already touched output. The
// systems run in interleaved rounds (warm-up rounds, then timed rounds, each round timing every
// system once), so that load from other processes on a shared machine falls on all of them alike.
// Also printed: each system's max error on the first 2^20 inputs against a long double
// reference, and the same loop copying the bytes (the memory floor).
//
// Also W1c's body (gelu(x w + b) sigmoid(x)) on one row held in L1: ns per element and each
// system's largest elementwise relative error.
// Output: one JSON object per measurement, then a table of times and ratios. Without Eigen on the
// include path (CMake: link Eigen3::Eigen) the Eigen rows are skipped.
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

namespace vm = fusebox::vmath;
using batch = xsimd::batch<float>;
using ld = long double;

constexpr std::size_t n = std::size_t(1) << 24;
constexpr int warmups = 3;
constexpr int runs = 20;
constexpr std::size_t checked = std::size_t(1) << 20;

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
    double us;
    accuracy acc;
};

std::vector<result> results;

double seconds_of(std::function<void()> const& run) {
    auto const start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

void compare(char const* fn, std::vector<system_run> const& systems, float const* x, float const* y,
             ld (*ref)(ld)) {
    std::vector<std::vector<double>> t(systems.size());
    for (int round = 0; round < warmups + runs; ++round)
        for (std::size_t s = 0; s < systems.size(); ++s) {
            double const us = seconds_of(systems[s].run);
            if (round >= warmups) t[s].push_back(us);
        }
    for (std::size_t s = 0; s < systems.size(); ++s) {
        std::sort(t[s].begin(), t[s].end());
        double const us = (t[s][runs / 2 - 1] + t[s][runs / 2]) / 2;
        systems[s].run();  // its own output, for the accuracy check
        accuracy const acc = ref ? measure(x, y, ref) : accuracy{};
        results.push_back({fn, systems[s].system, us, acc});
        std::printf(
            "{\"workload\":\"vmath_%s\",\"system\":\"%s\",\"mode\":\"eager\",\"threads\":1,\"n\":%zu,"
            "\"median_us\":%.1f,\"min_us\":%.1f,\"gelem_per_s\":%.3f,\"gbps\":%.2f,\"max_rel_err\":%.3g,"
            "\"max_abs_err\":%.3g,\"config\":\"%s\"}\n",
            fn, systems[s].system, n, us, t[s].front(), n / (us * 1e3), 2.0 * n * sizeof(float) / (us * 1e3),
            acc.rel, acc.abs, systems[s].config);
    }
}

ld ref_exp(ld v) { return std::exp(v); }
ld ref_log(ld v) { return std::log(v); }
ld ref_erf(ld v) { return std::erf(v); }
ld ref_tanh(ld v) { return std::tanh(v); }
ld ref_gelu(ld v) { return ld(0.5) * v * std::erfc(-v / std::sqrt(ld(2))); }

// W1c's body (BENCHMARKS.md: y = gelu(x w + b) sigmoid(x)) over `count` floats; t = x w + b is kept
// in `t` so that the accuracy check can start from the same rounded t the system used.
FUSEBOX_BENCH_OPAQUE void w1c_fusebox(float const* x, float const* w, float const* b, float* t, float* y,
                                      std::size_t count) {
    std::size_t i = 0;
    for (; i + batch::size <= count; i += batch::size) {
        batch const xv = batch::load_unaligned(x + i);
        batch const tv = xsimd::fma(xv, batch::load_unaligned(w + i), batch::load_unaligned(b + i));
        tv.store_unaligned(t + i);
        (vm::gelu(tv) * vm::sigmoid(xv)).store_unaligned(y + i);
    }
    for (; i < count; ++i) {
        t[i] = std::fma(x[i], w[i], b[i]);
        y[i] = vm::gelu(t[i]) * vm::sigmoid(x[i]);
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
    std::vector<std::pair<char const*, body>> systems{{"fusebox", w1c_fusebox}};
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
        double const err = w1c_rel_err(x.data(), t.data(), y.data(), checked);
        std::printf("{\"workload\":\"vmath_w1c_body_in_l1\",\"system\":\"%s\",\"mode\":\"eager\",\"threads\":1,"
                    "\"row\":%zu,\"median_ns_per_elem\":%.4f,\"max_elementwise_rel_err\":%.3g}\n",
                    systems[s].first, row, (ns[s][runs / 2 - 1] + ns[s][runs / 2]) / 2, err);
    }
}

}  // namespace

int main() {
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
        v.push_back({"eigen", config, [&x, &y, expr] { y = expr(x); }});
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
    char const* xs = "same loop, xsimd 8.1 functions";
    char const* eg = "Eigen 3.4 ArrayXf expression, default EIGEN_FAST_MATH";
    static constexpr float rsqrt2 = 0.70710678118654752f;

    fill(-1, 1);
    compare("copy", {{"limit", "same loop, y = x: the memory floor", [&] {
                          elementwise(px, py, n, [](auto v) { return v; });
                      }}},
            px, py, nullptr);

    fill(-10, 10);
    compare("exp",
            with({{"fusebox", fb, [&] { elementwise(px, py, n, [](auto v) { return vm::exp(v); }); }},
                  {"xsimd", xs, [&] { elementwise(px, py, n, [](auto v) { return xsimd::exp(v); }); }}},
                 eigen(eg, [](auto const& a) { return a.exp(); })),
            px, py, ref_exp);

    fill(1e-3f, 100.f);
    compare("log",
            with({{"fusebox", fb, [&] { elementwise(px, py, n, [](auto v) { return vm::log(v); }); }},
                  {"xsimd", xs, [&] { elementwise(px, py, n, [](auto v) { return xsimd::log(v); }); }}},
                 eigen(eg, [](auto const& a) { return a.log(); })),
            px, py, ref_log);

    fill(-6, 6);
    compare("erf",
            with({{"fusebox", fb, [&] { elementwise(px, py, n, [](auto v) { return vm::erf(v); }); }},
                  {"xsimd", xs, [&] { elementwise(px, py, n, [](auto v) { return xsimd::erf(v); }); }}},
                 eigen(eg, [](auto const& a) { return a.erf(); })),
            px, py, ref_erf);

    compare("tanh",
            with({{"fusebox", fb, [&] { elementwise(px, py, n, [](auto v) { return vm::tanh(v); }); }},
                  {"xsimd", xs, [&] { elementwise(px, py, n, [](auto v) { return xsimd::tanh(v); }); }}},
                 eigen(eg, [](auto const& a) { return a.tanh(); })),
            px, py, ref_tanh);

    // gelu: the peers use the textbook 0.5 x (1 + erf(x / sqrt2)) with their own erf.
    compare("gelu",
            with({{"fusebox", fb, [&] { elementwise(px, py, n, [](auto v) { return vm::gelu(v); }); }},
                  {"xsimd", "same loop, 0.5 x (1 + xsimd::erf(x / sqrt2))",
                   [&] {
                       elementwise(px, py, n, [](auto v) {
                           using V = decltype(v);
                           if constexpr (std::is_same_v<V, float>)
                               return 0.5f * v * (1.f + std::erf(v * rsqrt2));
                           else
                               return V(0.5f) * v * (V(1.f) + xsimd::erf(v * V(rsqrt2)));
                       });
                   }}},
                 eigen("0.5 x (1 + (x / sqrt2).erf()) as one Eigen expression",
                       [](auto const& a) { return 0.5f * a * (1.f + (a * rsqrt2).erf()); })),
            px, py, ref_gelu);

    w1c_in_cache();

    std::printf("\nvmath: %zu floats, 1 thread, median of %d interleaved rounds after %d warm-up rounds; "
                "memory floor (copy) %.2f ms\n",
                n, runs, warmups, results.front().us / 1e3);
    std::printf("%-6s %11s %10s %10s %9s %9s   %s\n", "fn", "fusebox ms", "xsimd ms", "eigen ms", "xsimd/fb",
                "eigen/fb", "max rel err: fusebox / xsimd / eigen");
    for (char const* fn : {"exp", "log", "erf", "tanh", "gelu"}) {
        result const* r[3] = {};
        for (auto const& res : results)
            if (res.fn == fn) r[res.system == "fusebox" ? 0 : res.system == "xsimd" ? 1 : 2] = &res;
        if (r[2])
            std::printf("%-6s %11.2f %10.2f %10.2f %9.2f %9.2f   %.1e / %.1e / %.1e\n", fn, r[0]->us / 1e3,
                        r[1]->us / 1e3, r[2]->us / 1e3, r[1]->us / r[0]->us, r[2]->us / r[0]->us, r[0]->acc.rel,
                        r[1]->acc.rel, r[2]->acc.rel);
        else
            std::printf("%-6s %11.2f %10.2f %10s %9.2f %9s   %.1e / %.1e / -\n", fn, r[0]->us / 1e3, r[1]->us / 1e3,
                        "-", r[1]->us / r[0]->us, "-", r[0]->acc.rel, r[1]->acc.rel);
    }
    return 0;
}
