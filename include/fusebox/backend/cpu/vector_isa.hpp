// backend/cpu/vector_isa.hpp: xsimd and the x86 intrinsics, included under one diagnostic guard.
// GCC 12's AVX-512 headers build vectors from _mm512_undefined_ps() and friends, which
// -Wmaybe-uninitialized and -Wuninitialized (both in -Wall) flag once they are inlined into a
// kernel: false positives, each printed with its whole inlining context, i.e. the user's model
// types spelled out. One training unit built with -O2 -march=native -Wall printed 10 GB of them
// (145 CPU-s and 5.0 GB, against 33 CPU-s and 0.97 GB with this guard; docs/benchmarks.md,
// run AI). GCC matches a diagnostic against the pragmas in force at the line it names, so
// ignoring the two around these includes silences the intrinsics' own lines and leaves the
// warnings on in user code. Two ways around it: a program that includes <immintrin.h> or xsimd
// before fusebox, and GCC 12 reading fusebox from a precompiled header (it does not keep
// diagnostic pragmas in one); -Wno-maybe-uninitialized -Wno-uninitialized is their remedy.
// Every fusebox header reaches xsimd and <immintrin.h> through this one (thread_pool.hpp takes
// _mm_pause from <xmmintrin.h>, which has no AVX-512 part).
// Depends on: xsimd, <immintrin.h> (included first).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#include <immintrin.h>
#endif

// Without optimisation (-O0, CMake's Debug) GCC 12 defines some AVX-512 intrinsics as macros
// instead of functions. Two of them, _mm512_mask_blend_epi8 and _epi16, cast their operands in C
// style, which does not reach xsimd's conversion from batch<T> to __m512i: every switch in
// xsimd's integer select instantiates them, so a Debug build on an AVX-512 machine that used pow
// (or anything else that reaches that select) did not compile. Defined here as the functions they
// are with optimisation, before xsimd reads them (a program that includes xsimd before fusebox
// still sees the macros: include fusebox first). The tests built at -O0 check it.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__) && defined(__AVX512BW__)
#undef _mm512_mask_blend_epi8
#undef _mm512_mask_blend_epi16
extern __inline __m512i __attribute__((__gnu_inline__, __always_inline__, __artificial__))
_mm512_mask_blend_epi8(__mmask64 u, __m512i a, __m512i w) { return _mm512_mask_mov_epi8(a, u, w); }
extern __inline __m512i __attribute__((__gnu_inline__, __always_inline__, __artificial__))
_mm512_mask_blend_epi16(__mmask32 u, __m512i a, __m512i w) { return _mm512_mask_mov_epi16(a, u, w); }
#endif

#include <xsimd/xsimd.hpp>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
