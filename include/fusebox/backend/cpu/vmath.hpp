// fusebox/backend/cpu/vmath.hpp: fast, accurate transcendental functions for the CPU kernels.
//
// Each function takes float, double, xsimd::batch<float, A> or xsimd::batch<double, A> and is
// written once, as a template over the value type V. The algorithm only uses the helpers in
// `detail` (fma, select, abs, min, bit casts, any/all), which have a scalar and a batch overload,
// so a scalar call runs the same operations in the same order as one lane of a batch call and
// returns the same bits. Vectorised loops can therefore finish with a scalar tail without their
// results depending on where the tail falls. The guarantee holds against xsimd::batch<T,
// xsimd::default_arch>: the scalar fma is fused exactly when that arch's fma is (fma3, fma4,
// AVX-512, NEON64), and no product meets an add outside an explicit fma, so floating-point
// contraction (GCC's default -ffp-contract=fast) cannot make the paths differ. Tested with GCC 12
// and Clang 14, at -O2 and -O3, contraction on and off.
//
// Depends on xsimd 8 and the standard library only. No std:: or xsimd:: transcendental is called;
// sqrt is the correctly rounded hardware instruction in both paths.
//
// Functions (fusebox::vmath, Hana-style function objects) and what each handles:
//   exp, log, erf, tanh, sigmoid, silu, gelu (exact, erf based), gelu_tanh, sqrt, rsqrt.
//   - NaN in gives NaN out. +-inf and over/underflow give the limit of the function.
//   - exp: overflow gives +inf, underflow gives (possibly subnormal) results down to 0.
//   - log: log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, subnormal inputs are exact-scaled.
//   - erf, tanh saturate to exactly +-1; odd symmetry is exact (f(-x) == -f(x), -0 stays -0).
//   - sigmoid, silu, gelu, gelu_tanh never return NaN for a non-NaN input (also at +-inf).
//
// Errors: every figure in the comments below was measured by tests/cpu/vmath.cpp (dense grids over
// the range, all special values, and 2^20 seeded random inputs per function and type, against
// long double references), as the maximum over three builds: -march=native (AVX-512),
// -mavx2 -mfma, and plain x86-64 (SSE2, where fma is not fused). "ulp" is measured in the unit of
// the result's own type; "rel" is the relative error against max(|f(x)|, 2^-100) for float and
// max(|f(x)|, 2^-960) for double (tiny results count by their absolute error; gelu flushes
// results below 1.4e-38 / 4e-308 to -0). eps = 2^-24 (float), 2^-53 (double).
//
// Coefficients are minimax fits (Sollya fpminimax, coefficients rounded to the working type) for
// the reduced ranges named in each kernel; the fitted error of each kernel is noted beside it.
#pragma once

#include <fusebox/backend/cpu/vector_isa.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace fusebox::vmath {
namespace detail {

// ---- value types ------------------------------------------------------------------------------

template <class V>
struct lane_of {};
template <>
struct lane_of<float> {
    using type = float;
};
template <>
struct lane_of<double> {
    using type = double;
};
template <class T, class A>
struct lane_of<xsimd::batch<T, A>> {
    using type = T;
};
template <class V>
using lane_t = typename lane_of<V>::type;

template <class V>
inline constexpr bool is_vmath_value = false;
template <>
inline constexpr bool is_vmath_value<float> = true;
template <>
inline constexpr bool is_vmath_value<double> = true;
template <class A>
inline constexpr bool is_vmath_value<xsimd::batch<float, A>> = true;
template <class A>
inline constexpr bool is_vmath_value<xsimd::batch<double, A>> = true;

// Unsigned integer of the same width, lane-wise.
template <class V>
struct bits_of {};
template <>
struct bits_of<float> {
    using type = std::uint32_t;
};
template <>
struct bits_of<double> {
    using type = std::uint64_t;
};
template <class T, class A>
struct bits_of<xsimd::batch<T, A>> {
    using type = xsimd::batch<typename bits_of<T>::type, A>;
};
template <class V>
using bits_t = typename bits_of<V>::type;

// detail::fma below is a real fused multiply-add exactly on these archs: xsimd's own kernel on
// fma3, fma4 and NEON64, an intrinsic on AVX-512; elsewhere it is x * y + z.
template <class A>
inline constexpr bool arch_fuses_fma =
    std::is_base_of_v<xsimd::fma3<xsimd::sse4_2>, A> || std::is_base_of_v<xsimd::fma3<xsimd::avx>, A> ||
    std::is_base_of_v<xsimd::fma3<xsimd::avx2>, A> || std::is_base_of_v<xsimd::fma4, A> ||
    std::is_base_of_v<xsimd::avx512f, A> || std::is_base_of_v<xsimd::neon64, A>;

// Whether detail::fma below is a fused multiply-add for V.
template <class V>
inline constexpr bool fuses_fma = arch_fuses_fma<xsimd::default_arch>;
template <class T, class A>
inline constexpr bool fuses_fma<xsimd::batch<T, A>> = arch_fuses_fma<A>;

// ---- helpers: one scalar and one batch overload each ---------------------------------------------
// GCC contracts a * b + c into an fma by default in C++ (-ffp-contract=fast), and may do so in the
// scalar path and not in the batch path or the other way round. So no product in the algorithms
// below feeds an add or a subtract directly: every multiply-add is an explicit fma().

template <class T>
    requires std::is_floating_point_v<T>
inline T fma(T a, T b, T c) noexcept {
    if constexpr (arch_fuses_fma<xsimd::default_arch>)
        return std::fma(a, b, c);
    else
        return a * b + c;
}
template <class T, class A>
inline xsimd::batch<T, A> fma(xsimd::batch<T, A> const& a, xsimd::batch<T, A> const& b,
                              xsimd::batch<T, A> const& c) noexcept {
#if XSIMD_WITH_AVX512F
    // xsimd 8.1 has no AVX-512 fma kernel: its generic x * y + z is fused or not at the compiler's
    // whim (GCC reuses an existing x * y and splits it), which would break the scalar == lane law
    // and the exact product-error terms.
    if constexpr (std::is_base_of_v<xsimd::avx512f, A>) {
        if constexpr (std::is_same_v<T, float>)
            return _mm512_fmadd_ps(a, b, c);
        else
            return _mm512_fmadd_pd(a, b, c);
    } else
#endif
        return xsimd::fma(a, b, c);
}

// a / b, correctly rounded in every lane (sqrt below likewise). xsimd 8 has no float division
// kernel for NEON64: it falls back to 32-bit NEON's reciprocal estimate and two Newton steps, so
// a / b was rounded twice (a lane 1 ulp from the scalar tail's quotient: tests/cpu/vmath.cpp under
// qemu-aarch64 had tanh at 3.3 ulp, sigmoid 3.1, and 10^5 scalar/batch mismatches each;
// docs/benchmarks.md, run AO). AArch64 has the instruction.
template <class T>
inline T div(T a, T b) noexcept {
    return a / b;
}
template <class T, class A>
inline xsimd::batch<T, A> div(xsimd::batch<T, A> const& a, xsimd::batch<T, A> const& b) noexcept {
#if XSIMD_WITH_NEON64
    if constexpr (std::is_same_v<T, float> && std::is_base_of_v<xsimd::neon64, A>)
        return vdivq_f32(a, b);
    else
#endif
        return a / b;
}

template <class T>
    requires std::is_floating_point_v<T>
inline T select(bool m, T a, T b) noexcept {
    return m ? a : b;
}
template <class T, class A>
inline xsimd::batch<T, A> select(xsimd::batch_bool<T, A> const& m, xsimd::batch<T, A> const& a,
                                 xsimd::batch<T, A> const& b) noexcept {
    return xsimd::select(m, a, b);
}

inline bool any(bool m) noexcept { return m; }
inline bool all(bool m) noexcept { return m; }
inline bool both(bool a, bool b) noexcept { return a && b; }
template <class T, class A>
inline bool any(xsimd::batch_bool<T, A> const& m) noexcept {
    return xsimd::any(m);
}
template <class T, class A>
inline bool all(xsimd::batch_bool<T, A> const& m) noexcept {
    return xsimd::all(m);
}
template <class T, class A>
inline xsimd::batch_bool<T, A> both(xsimd::batch_bool<T, A> const& a, xsimd::batch_bool<T, A> const& b) noexcept {
    return a & b;
}

template <class T>
    requires std::is_floating_point_v<T>
inline T abs(T x) noexcept {
    return std::fabs(x);
}
template <class T, class A>
inline xsimd::batch<T, A> abs(xsimd::batch<T, A> const& x) noexcept {
    return xsimd::abs(x);
}

// x86 minps semantics in both paths: b when either is NaN.
template <class T>
    requires std::is_floating_point_v<T>
inline T min(T a, T b) noexcept {
    return a < b ? a : b;
}
template <class T, class A>
inline xsimd::batch<T, A> min(xsimd::batch<T, A> const& a, xsimd::batch<T, A> const& b) noexcept {
    return xsimd::min(a, b);
}

template <class T>
    requires std::is_floating_point_v<T>
inline T sqrt(T x) noexcept {
    return std::sqrt(x);
}
// Correctly rounded, as the scalar std::sqrt. xsimd 8's float sqrt on NEON64 is 32-bit NEON's
// reciprocal-root estimate and Newton steps (sqrt(inf) NaN, 6.5e5 of 2.6e6 lanes off the scalar
// under qemu, run AO): AArch64 has the instruction.
template <class T, class A>
inline xsimd::batch<T, A> sqrt(xsimd::batch<T, A> const& x) noexcept {
#if XSIMD_WITH_NEON64
    if constexpr (std::is_same_v<T, float> && std::is_base_of_v<xsimd::neon64, A>)
        return vsqrtq_f32(x);
    else
#endif
        return xsimd::sqrt(x);
}

template <class T>
    requires std::is_floating_point_v<T>
inline bits_t<T> to_bits(T x) noexcept {
    return std::bit_cast<bits_t<T>>(x);
}
template <class T, class A>
inline bits_t<xsimd::batch<T, A>> to_bits(xsimd::batch<T, A> const& x) noexcept {
    return xsimd::bitwise_cast<bits_t<xsimd::batch<T, A>>>(x);
}

template <class V>
inline V from_bits(bits_t<V> const& u) noexcept {
    if constexpr (std::is_floating_point_v<V>)
        return std::bit_cast<V>(u);
    else
        return xsimd::bitwise_cast<V>(u);
}

// ---- per-type constants and fitted coefficients --------------------------------------------------

template <class T>
struct consts;

template <>
struct consts<float> {
    using uint = std::uint32_t;
    static constexpr int mant = 23;  // explicit mantissa bits
    static constexpr int bias = 127;
    static constexpr uint one_bits = 0x3f800000u;
    static constexpr uint sign_mask = 0x80000000u;
    static constexpr uint mant_mask = 0x007fffffu;
    static constexpr uint half_mask = 0xfffff000u;  // keeps 12 significant bits: squares are exact
    static constexpr float shifter = 0x1.8p23f;  // x + 1.5*2^23 rounds x to an integer in the low bits
    static constexpr float two_mant = 0x1p23f;
    static constexpr float min_normal = 0x1p-126f;
    static constexpr float max = 0x1.fffffep127f;

    static constexpr float log2e = 0x1.715476p0f;
    // Cody-Waite split of ln 2: ln2_hi has 15 significant bits, so n * ln2_hi is exact for
    // |n| < 512 even without a fused multiply-add.
    static constexpr float ln2_hi = 0x1.62e4p-1f;
    static constexpr float ln2_lo = 0x1.7f7d1cp-20f;
    // exp: |x| beyond these gives 0 / inf; the clamp keeps the wide path's scale exponents in range.
    static constexpr float exp_lo = -104.0f;
    static constexpr float exp_hi = 89.0f;
    // Beyond this |x| the table-driven exp (below) takes the wide path: up to it 2^k T is a normal
    // number (k >= -126) and k fits the exponent arithmetic.
    static constexpr float exp_table_normal = 87.0f;

    // expm1(r) ~= r + r^2 q(r) on |r| <= ln2/2; fitted relative error 2.3e-8 (2^-25.4).
    static constexpr std::array<float, 5> expm1_q = {0x1p-1f, 0x1.5554dep-3f, 0x1.55556cp-5f, 0x1.120ae2p-7f,
                                                     0x1.6ca9c8p-10f};

    // log: x = 2^k m with m in [2/3, 4/3); log1p(f) ~= f + f^2 Q(f) for f = m - 1 in [-1/3, 1/3];
    // fitted relative error 4.7e-9 (Lawson iterations in mpmath, rounded to float one coefficient
    // at a time with the rest refitted; run AU). The previous fit (8.3e-9) left log at 8.55e-8
    // relative over every normal float, above Eigen 3.4's 8.36e-8; this one 8.19e-8.
    static constexpr uint log_off = 0x3f2aaaabu;  // bits of 2/3
    static constexpr std::array<float, 9> log1p_q = {-0x1p-1f,        0x1.555506p-2f,  -0x1.fffef8p-3f,
                                                     0x1.99d05cp-3f,  -0x1.559c8cp-3f, 0x1.1ed452p-3f,
                                                     -0x1.f33206p-4f, 0x1.1e72ap-3f,   -0x1.07c134p-3f};

    // erf(x) ~= x + x P(x^2) on |x| < 0.875; fitted relative error 1.4e-8.
    static constexpr float erf_small = 0.875f;
    static constexpr std::array<float, 6> erf_p = {0x1.06eba6p-3f,  -0x1.812702p-2f, 0x1.ce2036p-4f,
                                                   -0x1.b6ea32p-6f, 0x1.499f5cp-8f,  -0x1.44aba8p-11f};
    // erfc(z) exp(z^2) ~= t G(t), t = 1 / (1 + p z), for z in [0, 10]; fitted relative error 1.3e-8.
    static constexpr float erfc_p = 0.375f;
    static constexpr std::array<float, 9> erfc_g = {0x1.b1625cp-3f, 0x1.af69f2p-3f, 0x1.a474c2p-3f,
                                                    0x1.f1e73ep-4f, 0x1.1827c2p-2f, -0x1.d567c6p-3f,
                                                    0x1.ba928cp-2f, -0x1.261ec2p-2f, 0x1.f7effep-5f};
    // erf(x) ~= M(x - 2.4) on [0.875, 3.92], absolute error 2.5e-8; erf rounds to 1 beyond 3.92
    // (erfc(3.92) = 2.96e-8 < 2^-25). No exp, no division: float erf needs no relative accuracy in
    // erfc.
    static constexpr float erf_mid_center = 2.4f;
    static constexpr float erf_one = 3.92f;
    static constexpr std::array<float, 15> erf_mid = {
        0x1.ffa5c2p-1f,  0x1.d2087ap-9f,  -0x1.17a42cp-7f, 0x1.989f26p-7f,  -0x1.8cfe32p-7f,
        0x1.025928p-7f,  -0x1.94d06cp-9f, 0x1.08fe08p-12f, 0x1.147b66p-11f, -0x1.6862c6p-12f,
        0x1.e19e42p-15f, 0x1.4670e4p-15f, -0x1.2e0ba4p-16f, -0x1.29bcf6p-20f, 0x1.5193a8p-20f};
    // gelu(x) for x < -13.1 is below 1.4e-38 and returned as -0; up to there exp(-x^2/2) / 2 is a
    // normal number.
    static constexpr float gelu_sat = 13.1f;
    static constexpr float tanh_sat = 10.0f;   // tanh(x) rounds to +-1 beyond

    static constexpr float rsqrt2 = 0x1.6a09e6p-1f;
    // gelu_tanh: 2 sqrt(2/pi) (x + 0.044715 x^3) = x (a + b x^2)
    static constexpr float gelu_tanh_a = 0x1.988454p0f;
    static constexpr float gelu_tanh_b = 0x1.2444f2p-4f;
};

template <>
struct consts<double> {
    using uint = std::uint64_t;
    static constexpr int mant = 52;
    static constexpr int bias = 1023;
    static constexpr uint one_bits = 0x3ff0000000000000ull;
    static constexpr uint sign_mask = 0x8000000000000000ull;
    static constexpr uint mant_mask = 0x000fffffffffffffull;
    static constexpr uint half_mask = 0xfffffffff8000000ull;  // keeps 26 significant bits
    static constexpr double shifter = 0x1.8p52;
    static constexpr double two_mant = 0x1p52;
    static constexpr double min_normal = 0x1p-1022;
    static constexpr double max = 0x1.fffffffffffffp1023;

    static constexpr double log2e = 0x1.71547652b82fep0;
    // ln2_hi has 32 significant bits: n * ln2_hi is exact for |n| < 2^21.
    static constexpr double ln2_hi = 0x1.62e42feep-1;
    static constexpr double ln2_lo = 0x1.a39ef35793c76p-33;
    static constexpr double exp_lo = -746.0;
    static constexpr double exp_hi = 710.0;

    // fitted relative error 3.7e-17 (2^-54.6).
    static constexpr std::array<double, 10> expm1_q = {
        0x1.0000000000001p-1, 0x1.555555555554dp-3, 0x1.5555555553cd1p-5, 0x1.11111111144d5p-7,
        0x1.6c16c178b047fp-10, 0x1.a01a018c397dep-13, 0x1.a019b89fe8f49p-16, 0x1.71de59d4710cfp-19,
        0x1.2891f308c782cp-22, 0x1.aeac32490c466p-26};

    // log: same reduction as float, then log1p(f) = f - s (f - z R(z)), s = f / (2 + f), z = s^2,
    // where 2 atanh(s) = 2s + s z R(z); z <= 0.04, fitted relative error of R 5.6e-17.
    static constexpr uint log_off = 0x3fe5555555555555ull;
    static constexpr std::array<double, 8> log_r = {0x1.5555555555555p-1, 0x1.999999999a09dp-2, 0x1.24924923b9518p-2,
                                                    0x1.c71c730c2b576p-3, 0x1.745c9f2b7bb04p-3, 0x1.3b2bc9231b82ep-3,
                                                    0x1.0e66a08b0b7ffp-3, 0x1.17b708d346da9p-3};

    // fitted relative error 2.5e-17.
    static constexpr double erf_small = 0.875;
    static constexpr std::array<double, 11> erf_p = {
        0x1.06eba8214db68p-3, -0x1.812746b037975p-2, 0x1.ce2f21a03ca23p-4, -0x1.b82ce3108a20ap-6,
        0x1.565bccb99961cp-8, -0x1.c02da39b10e4fp-11, 0x1.f9a12d348f053p-14, -0x1.f4ab227a4c6d9p-17,
        0x1.b7efce0b83a9cp-20, -0x1.4f9f38a6a4ba9p-23, 0x1.681f26adcbab8p-27};
    // z in [0, 27]; fitted relative error 3.1e-18.
    static constexpr double erfc_p = 0.25;
    static constexpr std::array<double, 23> erfc_g = {
        0x1.20dd7503e2879p-3,  0x1.20dd7515ace9cp-3,  0x1.17d6875c45e32p-3,  0x1.05c8d6155ba85p-3,
        0x1.d715a77d4e9f8p-4,  0x1.95c72f4f37474p-4,  0x1.4b29f6c9dd362p-4,  0x1.04c7d115463bbp-4,
        0x1.45468d0068185p-5,  0x1.7d3e54548017fp-5,  -0x1.ff1b1e60ca0a1p-6, 0x1.c71ad517eb7d3p-4,
        -0x1.616842afeb6cfp-3, 0x1.b6cc80a28cd1p-3,   -0x1.560f541e612f4p-3, 0x1.3526276381e05p-8,
        0x1.82576f1440f45p-3,  -0x1.3161daecf3a91p-2, 0x1.10ce0eaf97139p-2,  -0x1.36ff8d2380e35p-3,
        0x1.bfcb88d66028fp-5,  -0x1.757b4a302cc56p-7, 0x1.14cbf8f5b2edap-10};
    static constexpr double erf_sat = 6.0;     // erfc(6) = 2.2e-17 rounds 1 - erfc to 1
    static constexpr double gelu_sat = 37.6;   // gelu(x < -37.6) < 4e-308, returned as -0
    static constexpr double tanh_sat = 20.0;

    static constexpr double rsqrt2 = 0x1.6a09e667f3bcdp-1;
    static constexpr double two_rsqrtpi = 0x1.20dd750429b6dp0;  // 2 / sqrt(pi)
    static constexpr double gelu_tanh_a = 0x1.9884533d43651p0;
    static constexpr double gelu_tanh_b = 0x1.2444f2a4d8b4bp-4;
};

// ---- table-driven float exp (AVX-512) ------------------------------------------------------------
// exp(x) = 2^k T_j (1 + lo_j) exp(r), m = round(x N / ln2) = k N + j, r = x - m ln2 / N: one
// permute picks T_j = 2^(j/N) rounded to float from a register-sized table (N = 16: one zmm), so
// exp(r) needs a polynomial for |r| <= ln2 / 32, three fmas shorter than the table-free one's
// (|r| <= ln2/2). lo_j = (2^(j/N) - T_j) / T_j, a second permute, keeps the result within ~1 ulp.
// Fitted relative error of 1 + r + r^2 q(r) (near-minimax, Chebyshev nodes, coefficients rounded
// to float): 4.7e-9. Measured on Zen 4 (docs/benchmarks.md, run AQ): exp 15% faster, gelu and
// sigmoid 6%. With AVX2 an 8-entry table (one ymm permute, two fmas saved) measured no faster, so
// AVX2, SSE2 and NEON keep the table-free exp.
template <int Bits>
struct exp_table;
template <>
struct exp_table<4> {
    static constexpr float log2e_n = 0x1.715476p4f;
    static constexpr float ln2_n_hi = 0x1.62e4p-5f;
    static constexpr float ln2_n_lo = 0x1.7f7d1cp-24f;
    static constexpr std::array<float, 16> hi = {
        0x1p0f,        0x1.0b5586p0f, 0x1.172b84p0f, 0x1.2387a6p0f, 0x1.306fe0p0f, 0x1.3dea64p0f,
        0x1.4bfdaep0f, 0x1.5ab07ep0f, 0x1.6a09e6p0f, 0x1.7a1148p0f, 0x1.8ace54p0f, 0x1.9c4918p0f,
        0x1.ae89fap0f, 0x1.c199bep0f, 0x1.d5818ep0f, 0x1.ea4afap0f};
    static constexpr std::array<float, 16> lo = {
        0.0f,             0x1.8d96d4p-25f,  -0x1.9c0c22p-27f, 0x1.964904p-25f, 0x1.125002p-25f, 0x1.370be4p-25f,
        -0x1.0a3550p-25f, -0x1.00d8acp-27f, 0x1.26055cp-26f,  -0x1.05cb44p-25f, 0x1.67a1cap-28f, 0x1.a3b5e4p-28f,
        -0x1.f9c304p-27f, -0x1.6961b4p-28f, -0x1.a5217cp-28f, 0x1.61428ep-28f};
    static constexpr std::array<float, 2> q = {0x1.000148p-1f, 0x1.55565cp-3f};
};

// log2 of the table's size for an arch: 0 where exp stays table-free.
template <class A>
inline constexpr int arch_exp_table_bits =
#if XSIMD_WITH_AVX512F
    std::is_base_of_v<xsimd::avx512f, A> ? 4 :
#endif
    0;
// For float values: the scalar path follows the default arch, so that a scalar tail computes what
// a lane computes.
template <class V>
inline constexpr int exp_table_bits = std::is_same_v<V, float> ? arch_exp_table_bits<xsimd::default_arch> : 0;
template <class A>
inline constexpr int exp_table_bits<xsimd::batch<float, A>> = arch_exp_table_bits<A>;

// tab[i mod N] in every lane, i the lane's bits (a permute: it reads only the low bits).
template <int Bits, std::size_t N>
inline float table_lookup(std::uint32_t i, std::array<float, N> const& tab) noexcept {
    return tab[i & (N - 1)];
}
template <int Bits, class A, std::size_t N>
inline xsimd::batch<float, A> table_lookup(xsimd::batch<std::uint32_t, A> const& i,
                                           std::array<float, N> const& tab) noexcept {
#if XSIMD_WITH_AVX512F
    if constexpr (Bits == 4 && std::is_base_of_v<xsimd::avx512f, A>)
        return _mm512_permutexvar_ps(i, _mm512_loadu_ps(tab.data()));
    else
#endif
        static_assert(Bits < 0, "fusebox internal: no table permute for this arch");
}

// c[0] + x (c[1] + x (...)), unrolled at compile time (GCC keeps a runtime loop otherwise).
template <class V, class T, std::size_t N, std::size_t... I>
inline V horner_unrolled(V const& x, std::array<T, N> const& c, std::index_sequence<I...>) noexcept {
    V r = V(c[N - 1]);
    ((r = detail::fma(r, x, V(c[N - 2 - I]))), ...);
    return r;
}
template <class V, class T, std::size_t N>
inline V horner(V const& x, std::array<T, N> const& c) noexcept {
    return detail::horner_unrolled(x, c, std::make_index_sequence<N - 1>{});
}

// 2^k for integer-valued k with 2^k a normal number.
template <class V>
inline V pow2i(V const& k) noexcept {
    using C = consts<lane_t<V>>;
    using U = bits_t<V>;
    return from_bits<V>((to_bits(k + V(C::shifter)) << C::mant) + U(C::one_bits));
}

template <class V>
inline V with_sign_of(V const& magnitude, V const& x) noexcept {
    using C = consts<lane_t<V>>;
    using U = bits_t<V>;
    return from_bits<V>(to_bits(magnitude) | (to_bits(x) & U(C::sign_mask)));
}

// NaN-preserving clamp (a NaN compares false and passes through).
template <class V>
inline V clamp(V const& x, V const& lo, V const& hi) noexcept {
    return detail::select(x < lo, lo, detail::select(x > hi, hi, x));
}

// ---- exp and expm1 ---------------------------------------------------------------------------------
// x = n ln2 + r, n = round(x log2e), |r| <= ln2/2 (Cody-Waite, two fmas); exp(x) = 2^n (1 + p),
// p = r + r^2 q(r). 2^n is built in the exponent field from the rounding shifter's low bits.
// Float with AVX-512 instead: x = m ln2/N + r, m = kN + j, exp(x) = 2^k T_j (1 + p), p =
// lo_j + r + r^2 q(r) (exp_table above).

template <class V>
struct exp_parts {
    V n;      // round(x log2e); with a table, m = round(x N log2e)
    V p;      // expm1(x - n ln2); with a table, expm1(x - m ln2/N) + lo_j
    V scale;  // 2^(n + K); with a table, 2^(floor(m/N) + K) T_j: valid where it is a normal number
};

// The factor 2^K is free: it goes into the exponent bias. Table = false: the table-free form even
// where a table exists, for expm1_small: the table's polynomial is accurate relative to exp(r),
// not to expm1(r) (its 4.7e-9 of exp(r) is 4.7e-9 / r of expm1(r): tanh measured 3.5 ulp near
// 2|x| = 0.02 with it). Lo = true: the reduction of x + lo, for an argument carried as hi + lo
// (|lo| about an ulp of x): lo joins r, which is at most ln2/2, so it costs one add and a rounding
// of r's ulp, where exp(x) (1 + lo) after the fact costs an fma and a rounding of the result's.
template <int K = 0, bool Table = true, bool Lo = false, class V>
inline exp_parts<V> exp_reduce(V const& x, V const& lo = V()) noexcept {
    using C = consts<lane_t<V>>;
    using U = bits_t<V>;
    constexpr int B = Table ? exp_table_bits<V> : 0;
    if constexpr (B > 0) {
        using X = exp_table<B>;
        V t = detail::fma(x, V(X::log2e_n), V(C::shifter));
        V m = t - V(C::shifter);
        // With the fused fma the first step is exact: m ln2_n_hi and x agree in their leading bits.
        V r = detail::fma(m, V(-X::ln2_n_hi), x);
        r = detail::fma(m, V(-X::ln2_n_lo), r);
        if constexpr (Lo) r = r + lo;
        U tb = to_bits(t);  // m in its low bits (two's complement): the permutes' index
        V p = detail::fma(r * r, detail::horner(r, X::q), r) + table_lookup<B>(tb, X::lo);
        // floor(m / N) + K in the exponent field: m's low 9 + B bits shifted up, its lowest B
        // bits (j) masked off; adding it to T_j's bits scales T_j (mod 2^32, so negatives work).
        U k_field = ((tb << (C::mant - B)) & U(0xff800000u)) + U(typename C::uint(K) << C::mant);
        return {m, p, from_bits<V>(to_bits(table_lookup<B>(tb, X::hi)) + k_field)};
    } else {
        V t = detail::fma(x, V(C::log2e), V(C::shifter));
        V n = t - V(C::shifter);
        V r = detail::fma(n, V(-C::ln2_hi), x);
        r = detail::fma(n, V(-C::ln2_lo), r);
        if constexpr (Lo) r = r + lo;
        V p = detail::fma(r * r, detail::horner(r, C::expm1_q), r);
        U bias = U(C::one_bits + (typename C::uint(K) << C::mant));
        return {n, p, from_bits<V>((to_bits(t) << C::mant) + bias)};
    }
}

// 2^K exp(hi + lo), for an argument carried as hi + lo (a square's two parts), where 2^(n + K) is a
// normal number: hi in about [-87.3, 88.7] (float) or [-708, 709] (double) for K = 0.
template <int K = 0, class V>
inline V exp_normal(V const& hi, V const& lo) noexcept {
    exp_parts<V> e = exp_reduce<K, true, true>(hi, lo);
    return detail::fma(e.scale, e.p, e.scale);
}

// exp for |n| >= bias, on the clamped range: 2^n is split as s1 * s2 so that subnormal and
// near-overflow results are formed without spurious overflow.
template <class V>
inline V exp_wide(V x) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    x = detail::clamp(x, V(C::exp_lo), V(C::exp_hi));
    exp_parts<V> e = exp_reduce(x);
    if constexpr (exp_table_bits<V> > 0) {
        // 2^k T_j = s1 (2^(k - k1) T_j), k1 = bias where k >= 1 (m >= N), else 2 - bias: both
        // factors normal on the clamped range. s1's exponent field minus one's is k1 << mant.
        constexpr T N = T(1 << exp_table_bits<V>);
        V s1 = detail::select(e.n >= V(N), V(T(0x1p127)), V(T(0x1p-125)));
        V s2 = from_bits<V>(to_bits(e.scale) - (to_bits(s1) - bits_t<V>(C::one_bits)));
        return detail::fma(s2, e.p, s2) * s1;
    } else {
        V k1 = detail::select(e.n > V(0), V(T(C::bias)), V(T(2 - C::bias)));
        V s1 = detail::pow2i(k1);
        V s2 = detail::pow2i(e.n - k1);
        return detail::fma(s2, e.p, s2) * s1;
    }
}

template <class V>
inline V exp_impl(V const& x) noexcept {
    using C = consts<lane_t<V>>;
    exp_parts<V> e = exp_reduce(x);
    V y = detail::fma(e.scale, e.p, e.scale);
    // |n| >= bias (with a table: |x| > exp_table_normal): 2^n is not a normal number, or x is huge
    // or infinite. A NaN compares false and flows through the first path.
    auto wide = [&] {
        if constexpr (exp_table_bits<V> > 0)
            return detail::abs(x) > V(C::exp_table_normal);
        else
            return detail::abs(e.n) > V(C::bias - 1);
    }();
    if (detail::any(wide)) y = detail::select(wide, exp_wide(x), y);
    return y;
}

// expm1 for 0 <= x <= 2 tanh_sat (2^n stays normal): fma(2^n, p, 2^n - 1) keeps the relative
// accuracy of p where n = 0.
template <class V>
inline V expm1_small(V const& x) noexcept {
    exp_parts<V> e = exp_reduce<0, false>(x);
    return detail::fma(e.scale, e.p, e.scale - V(1));
}

// ---- log ---------------------------------------------------------------------------------------------

template <class V>
inline V log1p_kernel(V const& f) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    if constexpr (std::is_same_v<T, float>) {
        return detail::fma(f * f, detail::horner(f, C::log1p_q), f);
    } else {
        // A degree-22 polynomial would be needed for double on [-1/3, 1/3]; the atanh form needs
        // one division and eight coefficients.
        V s = detail::div(f, f + V(2));
        V z = s * s;
        return detail::fma(-s, detail::fma(-z, detail::horner(z, C::log_r), f), f);
    }
}

template <class V>
inline V log_impl(V const& x) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    using U = bits_t<V>;
    auto normal = both(x >= V(C::min_normal), x <= V(C::max));  // false for 0, <0, inf, NaN, subnormal
    bool const fast = detail::all(normal);
    V xs = x;
    if (!fast) xs = detail::select(x < V(C::min_normal), x * V(C::two_mant), x);
    // v's exponent field holds k + bias where x = 2^k m, m in [2/3, 4/3).
    U v = to_bits(xs) + U(C::one_bits - C::log_off);
    V k = from_bits<V>((v >> C::mant) | to_bits(V(C::two_mant))) - V(C::two_mant + C::bias);
    if (!fast) k = k - detail::select(x < V(C::min_normal), V(T(C::mant)), V(T(0)));
    V m = from_bits<V>((v & U(C::mant_mask)) + U(C::log_off));
    V f = m - V(1);  // exact
    V y = log1p_kernel(f);
    y = detail::fma(k, V(C::ln2_lo), y);
    y = detail::fma(k, V(C::ln2_hi), y);
    if (!fast) {
        V const inf(std::numeric_limits<T>::infinity());
        y = detail::select(x == V(0), -inf, y);
        y = detail::select(x == inf, inf, y);
        y = detail::select(x >= V(0), y, V(std::numeric_limits<T>::quiet_NaN()));
    }
    return y;
}

// ---- erf and the Gaussian tail ---------------------------------------------------------------------

// c a^2 = hi + lo to about twice the working precision, for a >= 0 and c a power of two. With a
// fused fma, lo = c fma(a, a, -a^2) is exact. Without one that is 0, so a = h + l is split with h
// holding the upper half of the significand bits: h^2 and 2hl are exact and
// c a^2 = c h^2 + 2c hl + c l^2 is summed with a fast two-sum. Every product that meets an add is
// exact or an explicit fma, so contraction cannot make the two paths differ.
template <class V>
struct twice {
    V hi, lo;
};
template <class V>
inline twice<V> scaled_square(V const& a, lane_t<V> c) noexcept {
    using C = consts<lane_t<V>>;
    using U = bits_t<V>;
    if constexpr (fuses_fma<V>) {
        V sq = a * a;
        return {V(c) * sq, V(c) * detail::fma(a, a, -sq)};
    }
    V h = from_bits<V>(to_bits(a) & U(C::half_mask));
    V l = a - h;
    V ch = V(c) * h;
    V hh = ch * h;
    V twice_chl = (ch + ch) * l;
    V hi = hh + twice_chl;
    V err = twice_chl - (hi - hh);
    return {hi, detail::fma(V(c) * l, l, err)};
}

// erfc(z) exp(z^2) = t G(t), t = 1 / (1 + p z), for z >= 0. Callers multiply by exp(-z^2), with
// z^2 carried as hi + lo: the low part keeps the tail's relative error at a few ulp, where
// rounding z^2 alone would cost z^2 / 2 ulp (35 ulp at z = 8.4).
template <class V>
inline V erfc_scaled(V const& z) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    if constexpr (std::is_same_v<T, float>) {
        V t = detail::div(V(1), detail::fma(V(C::erfc_p), z, V(1)));
        return t * detail::horner(t, C::erfc_g);
    } else {
        // R = t G(t) amplifies the rounding of t by |d log R / d log t| = 4.5 near z = 0, 9 eps in
        // all. So t is carried as t (1 + d) (p z is exact, 1 + p z is a two-sum) and R corrected by
        // its derivative: dR/dt t d = -(2 z R - 2/sqrt(pi)) d (1 + p z) / p. That leaves 3-4 eps.
        V pz = V(C::erfc_p) * z;
        V den = V(1) + pz;
        V b = den - V(1);
        V den_lo = (V(1) - (den - b)) + (pz - b);
        V t = detail::div(V(1), den);
        V d = detail::fma(-t, den_lo, detail::fma(-t, den, V(1)));
        V r = t * detail::horner(t, C::erfc_g);
        V slope = detail::fma(z + z, r, V(-C::two_rsqrtpi));
        return detail::fma(-slope, (d * den) * V(1 / C::erfc_p), r);
    }
}

// Both ranges are evaluated for every lane and selected: with typical data most batches hold lanes
// of both, and a branch on "all lanes small" mispredicted often enough to cost more (AVX2: 35%).
template <class V>
inline V erf_impl(V const& x) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    V z = detail::abs(x);
    V near = detail::fma(x, detail::horner(x * x, C::erf_p), x);
    V far;
    if constexpr (std::is_same_v<T, float>) {
        V m = detail::horner(z - V(C::erf_mid_center), C::erf_mid);
        far = detail::select(z > V(C::erf_one), V(1), m);
    } else {
        V zc = detail::select(z > V(C::erf_sat), V(C::erf_sat), z);
        twice<V> q = scaled_square(zc, T(-1));
        far = detail::fma(-exp_normal(q.hi, q.lo), erfc_scaled(zc), V(1));
    }
    return detail::select(z < V(C::erf_small), near, with_sign_of(far, x));
}

// x Phi(x) with Phi(x) = erfc(-x/sqrt2) / 2, through the Gaussian tail for both signs: for x < 0 the
// result keeps its relative accuracy (1 + erf(x/sqrt2) would cancel), and no lane needs a second
// path.
template <class V>
inline V gelu_impl(V const& x) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    V a = detail::min(detail::abs(x), V(C::gelu_sat));  // a NaN x still makes x * phi NaN
    twice<V> q = scaled_square(a, T(-0.5));
    // exp(-a^2/2) / 2, with the square's low part inside the reduction (run BB: 5.06e-7 -> 4.75e-7
    // over every float with AVX2, at the same instruction count).
    V he = exp_normal<-1>(q.hi, q.lo);
    V g = erfc_scaled(a * V(C::rsqrt2));
    V phi = detail::select(x >= V(0), detail::fma(-he, g, V(1)), he * g);  // P(N <= x)
    return detail::select(x < V(-C::gelu_sat), V(T(-0.0)), x * phi);
}

// ---- tanh and the logistic family ----------------------------------------------------------------

// tanh(|x|) = e / (e + 2), e = expm1(2|x|): relative accuracy down to the smallest subnormal with
// one path and one division.
template <class V>
inline V tanh_impl(V const& x) noexcept {
    using C = consts<lane_t<V>>;
    V a = detail::abs(x);
    a = detail::select(a > V(C::tanh_sat), V(C::tanh_sat), a);
    V e = expm1_small(a + a);
    return with_sign_of(detail::div(e, e + V(2)), x);
}

// num / (1 + exp(-|w|)) with num = n(w) for w >= 0 and n(w) exp(-|w|) below: exp never overflows,
// so 1 / (1 + exp(-w)) keeps its relative accuracy for w << 0 (down to the subnormals) and is
// never NaN.
template <class V>
inline V logistic_times(V const& n, V const& w) noexcept {
    V e = exp_impl(-detail::abs(w));
    return detail::div(detail::select(w >= V(0), n, n * e), V(1) + e);
}

template <class V>
inline V sigmoid_impl(V const& x) noexcept {
    return logistic_times(V(1), x);
}

template <class V>
inline V silu_impl(V const& x) noexcept {
    using T = lane_t<V>;
    V y = logistic_times(x, x);
    return detail::select(x == V(-std::numeric_limits<T>::infinity()), V(T(-0.0)), y);
}

// 0.5 x (1 + tanh(u)) = x sigmoid(2u): no cancellation for x < 0. The rounding of 2u in the
// working type (a few ulp) limits the relative error to about |2u| eps where u << 0.
template <class V>
inline V gelu_tanh_impl(V const& x) noexcept {
    using T = lane_t<V>;
    using C = consts<T>;
    V w = x * detail::fma(V(C::gelu_tanh_b), x * x, V(C::gelu_tanh_a));
    V y = logistic_times(x, w);
    return detail::select(x == V(-std::numeric_limits<T>::infinity()), V(T(-0.0)), y);
}

// ---- fast math (options::fast_math): float only -------------------------------------------------
// The contract (issue 24): no fast function's error exceeds Eigen 3.4's for the same function
// (Eigen's vectorised exp, log, erf, tanh, logistic; gelu as 0.5 x (1 + erf(x / sqrt2))), relative or
// absolute, over the same inputs (docs/benchmarks.md, run AU). The faithful exp, log, tanh and
// logistic family are already within it, and no shorter polynomial is: fast versions on the faithful
// polynomials without the corner-case paths measured slower than the faithful functions with
// AVX-512 (whose untaken branches cost less than always-evaluated selects) and at most 8% faster
// with AVX2, so fast math keeps them. What it changes is erf, one rational function (fast_consts)
// in place of the faithful erf's two polynomials, and gelu, Eigen's form on that erf, without the
// erfc tail that keeps the faithful gelu's relative accuracy for x << 0. A rational tanh of the
// same kind (degree 4 over 4 in x^2 on [0, 9]) measured 3.4e-7 over every normal float up to 9.5,
// against Eigen's 2.9e-7, so tanh has none. Double goes to the faithful functions, as NVRTC's
// --use_fast_math changes single precision only. The same helpers as above, so scalar == batch
// lane holds here too.
struct fast_consts {
    // erf(x) ~= x P(x^2) / Q(x^2) on |x| <= 3.92 (beyond, erf rounds to +-1), P and Q of degree 5: one
    // division in place of the faithful erf's two polynomials of 6 and 15 terms. Fitted relative error
    // 5.2e-8 (linearised Lawson iterations in mpmath on s = x^2 in [0, 18]); in float, over every
    // float in (0, 4.25], 3.58e-7 absolute and relative for normal x, against Eigen 3.4's erf's
    // 4.42e-7 over the same floats (bench/vmath_every_float.cpp; docs/benchmarks.md, run AU). 3.92 P(3.92^2) / Q(3.92^2) rounds to
    // 1, so the clamp gives exactly +-1 beyond, and the final clamp removes the fit's overshoot above 1
    // between 3.62 and 3.92.
    static constexpr std::array<float, 6> erf_p = {0x1.20dd74p+0f, 0x1.a34c18p-3f,  0x1.be3348p-5f,
                                                   0x1.1b63d4p-8f, 0x1.2df09p-12f, 0x1.e90b32p-20f};
    static constexpr std::array<float, 6> erf_q = {0x1p+0f,         0x1.07906p-1f,   0x1.eafcc4p-4f,
                                                   0x1.07df12p-6f,  0x1.4f7142p-10f, 0x1.2ce90ap-15f};
};

// Whether V has fast variants: float lanes.
template <class V>
using fast_enabled = std::bool_constant<std::is_same_v<lane_t<V>, float>>;

template <class V>
inline V fast_max(V const& lo, V const& x) noexcept {  // x when x is NaN (maxps semantics)
    if constexpr (std::is_floating_point_v<V>)
        return lo > x ? lo : x;
    else
        return xsimd::max(lo, x);
}

template <class V>
inline V fast_erf_impl(V const& x) noexcept {
    using C = consts<float>;
    using F = fast_consts;
    // The clamps pass NaN (min and max return their second operand then).
    V xc = detail::min(V(C::erf_one), fast_max(V(-C::erf_one), x));
    V s = xc * xc;
    V y = xc * detail::div(detail::horner(s, F::erf_p), detail::horner(s, F::erf_q));
    return detail::min(V(1), fast_max(V(-1), y));
}

template <class V>
inline V fast_gelu_impl(V const& x) noexcept {
    V h = V(0.5f) * x;
    return detail::fma(h, fast_erf_impl(x * V(consts<float>::rsqrt2)), h);
}

}  // namespace detail

/// a / b, correctly rounded in every lane and equal to the scalar quotient on every ISA
/// (detail::div): the ops' division (ops/elementwise.hpp).
template <class V>
inline V div(V const& a, V const& b) noexcept {
    return detail::div(a, b);
}

#define FUSEBOX_VMATH_REQUIRE(name, V)                                                      \
    static_assert(::fusebox::vmath::detail::is_vmath_value<V>,                              \
                  "vmath::" name "(x) requires 'x' to be float, double, xsimd::batch<float, A> " \
                  "or xsimd::batch<double, A>; convert other types first")

// exp(x): n ln2 + r reduction, degree-6 (float) / degree-11 (double) polynomial for expm1(r);
// float with AVX-512: n ln2/16 + r, a 16-entry table and a degree-3 polynomial (exp_table).
// Measured: float 1.08 ulp over every float of [-104, 89] with fma (AVX2; docs/benchmarks.md, run
// AW; samples: 1.06), AVX-512 0.78 and double 1.03 ulp on samples, subnormal results included
// (x in [-104, 89] / [-746, 710]); +inf above, +0 below.
inline constexpr struct exp_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("exp", V);
        return detail::exp_impl(x);
    }
} exp{};

// log(x): x = 2^k m, m in [2/3, 4/3); float: degree-10 polynomial for log1p(m - 1); double:
// 2 atanh(s) form (one division, degree 7 in s^2). Measured: float 0.93 ulp, double 1.30 ulp
// (1.15 with fma), over all positive floats / doubles including subnormals.
inline constexpr struct log_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("log", V);
        return detail::log_impl(x);
    }
} log{};

// erf(x): |x| < 0.875: x + x P(x^2) (relative accuracy down to the subnormals). Beyond, float: a
// degree-14 polynomial in |x| - 2.4 up to 3.92, then +-1; double: 1 - exp(-x^2) erfc_scaled(|x|)
// up to 6, then +-1. Measured: float 2.61 ulp, absolute 1.6e-7 on samples; with fma 2.50 ulp,
// absolute 1.5e-7 over every float of [-7, 7] (AVX2; docs/benchmarks.md, run AW; samples had
// shown 2.22 ulp, 1.3e-7); double 1.57 ulp, absolute 1.7e-16 (1.08 ulp with fma) on samples.
inline constexpr struct erf_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("erf", V);
        return detail::erf_impl(x);
    }
} erf{};

// tanh(x) = sign(x) e / (e + 2), e = expm1(2|x|). Measured: float 2.46 ulp, absolute 8.9e-8 over
// every float of [-22, 22] with fma (AVX2; samples: 2.34 ulp); double 2.29 ulp, absolute 1.7e-16
// on samples; relative accuracy holds down to the subnormals.
inline constexpr struct tanh_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("tanh", V);
        return detail::tanh_impl(x);
    }
} tanh{};

// sigmoid(x) = 1 / (1 + exp(-x)), evaluated as exp(x) / (1 + exp(x)) for x < 0: 0 and 1 at the
// ends, never NaN for a non-NaN x. Measured, float: 2.40 ulp (rel 1.8e-7) over every float of
// [-110, 110] with fma (AVX2; docs/benchmarks.md, run AW), where samples had shown 2.09 ulp; double
// 2.26 ulp (rel 3.1e-16) on samples.
inline constexpr struct sigmoid_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("sigmoid", V);
        return detail::sigmoid_impl(x);
    }
} sigmoid{};

// silu(x) = x sigmoid(x), same evaluation; silu(-inf) = -0. Measured rel: float 2.38e-7 over every
// float of [-110, 110] with fma (AVX2; samples: 2.2e-7), double 3.7e-16 on samples.
inline constexpr struct silu_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("silu", V);
        return detail::silu_impl(x);
    }
} silu{};

// gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt2)), the exact form, through erfc for both signs so
// that x << 0 keeps its relative accuracy. Measured rel, float: over every float of [-16, 16],
// 4.75e-7 with fma (AVX2 and AVX-512, at x = 0.0110406764; NEON under qemu gave AVX2's bits over
// every 16th float) and 5.29e-7 without (SSE2, over the 5e-7 target; docs/benchmarks.md, run BB).
// Double 7.4e-16 (6.2e-16 with fma) on samples. Results below 1.4e-38 (x < -13.1) and 4e-308
// (x < -37.6) are returned as -0.
inline constexpr struct gelu_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("gelu", V);
        return detail::gelu_impl(x);
    }
} gelu{};

// gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as
// x sigmoid(2u) (no cancellation for x < 0). Measured rel: float 8.9e-7 (9.2e-7 without fma),
// double 1.9e-15 for x >= -3, on samples. Below, the form is ill-conditioned: the rounding of 2u
// in the working type becomes |2u| eps relative error (float 1.7e-7 (1 + |2u|), double
// 3.5e-16 (1 + |2u|)).
inline constexpr struct gelu_tanh_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("gelu_tanh", V);
        return detail::gelu_tanh_impl(x);
    }
} gelu_tanh{};

// sqrt(x): the correctly rounded hardware square root (0.5 ulp).
inline constexpr struct sqrt_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("sqrt", V);
        return detail::sqrt(x);
    }
} sqrt{};

// rsqrt(x) = 1 / sqrt(x) with both steps correctly rounded, not the 12- or 14-bit estimate
// instructions (whose results differ between chips and would break scalar == lane). Measured:
// 1.48 ulp float and double.
inline constexpr struct rsqrt_fn {
    template <class V>
    V operator()(V const& x) const noexcept {
        FUSEBOX_VMATH_REQUIRE("rsqrt", V);
        return detail::div(V(1), detail::sqrt(x));
    }
} rsqrt{};

// ---- fusebox::vmath::fast: what options::fast_math evaluates ------------------------------------
// Float erf and gelu: the forms above, within Eigen 3.4's error (see fast_consts); double, and every
// other function: the faithful one (the same function, so the same results bit for bit). Errors
// measured by tests/cpu/vmath.cpp (float, against long double; the test bounds are these plus a
// margin, and no bound exceeds Eigen's error). NaN gives NaN; erf(+-inf) = +-1, gelu(+inf) = +inf,
// gelu(-inf) = NaN (faithful: -0); gelu(x) is +0 below -5.55.
namespace fast {

#define FUSEBOX_VMATH_FAST(fn, faithful)                                                      \
    inline constexpr struct fn##_fn {                                                         \
        template <class V>                                                                    \
        V operator()(V const& x) const noexcept {                                             \
            FUSEBOX_VMATH_REQUIRE("fast::" #fn, V);                                           \
            if constexpr (detail::fast_enabled<V>::value) return detail::fast_##fn##_impl(x); \
            else return faithful(x);                                                          \
        }                                                                                     \
    } fn{};

// erf: x P(x^2) / Q(x^2), clamped (fast_consts). Measured: absolute and relative 3.6e-7 for
// every normal float (faithful 1.3e-7, 1.6e-7; Eigen 4.4e-7).
FUSEBOX_VMATH_FAST(erf, vmath::erf)
// gelu: 0.5 x (1 + fast::erf(x / sqrt2)), Eigen's form: no erfc tail, so no relative accuracy for
// x << 0 (faithful: one exp, one division). Measured: absolute 9.6e-7 for |x| <= 16 (Eigen 1.5e-6
// on [-10, 10]).
FUSEBOX_VMATH_FAST(gelu, vmath::gelu)
#undef FUSEBOX_VMATH_FAST

inline constexpr exp_fn exp{};
inline constexpr log_fn log{};
inline constexpr tanh_fn tanh{};
inline constexpr sigmoid_fn sigmoid{};
inline constexpr silu_fn silu{};
inline constexpr gelu_tanh_fn gelu_tanh{};
inline constexpr sqrt_fn sqrt{};
inline constexpr rsqrt_fn rsqrt{};

}  // namespace fast

#undef FUSEBOX_VMATH_REQUIRE

}  // namespace fusebox::vmath
