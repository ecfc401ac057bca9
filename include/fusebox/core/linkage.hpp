// core/linkage.hpp: where the shape-independent code is compiled: the run-time path's code
// generators, planner and executors at their padded node counts, the kernel caches, the CUDA back
// end's host code. None of it depends on a model's types, yet header-only it is compiled again in
// every unit that calls it (69% of examples/quickstart.cpp's object code; issue 22).
//
//   default                  header-only: every unit compiles what it calls (one-file programs)
//   FUSEBOX_EXTERN_RUNTIME   in every unit of a program, and FUSEBOX_IMPLEMENTATION in exactly one
//                            of them, which includes <fusebox/fusebox.hpp>, train.hpp and data.hpp
//                            (tests/cmake/check-runtime-unit.cmake checks that it reaches every
//                            header with such code): the other units see explicit instantiation
//                            declarations (`extern template`) and declarations of the functions,
//                            and compile none of it; the implementation unit compiles it once.
//                            CMake: fusebox_add_runtime(<name>) (cmake/fusebox-runtime.cmake).
//
// Templates, after their definition, at the run-time path's padded node counts (16, 32, 64,
// 128: pipeline/dynamic_function.hpp's NB; a larger model's is compiled in its own unit):
//   #ifdef FUSEBOX_RUNTIME_INSTANCE
//   FUSEBOX_RUNTIME_INSTANCE class detail::cpu_codegen<16>;
//   #endif
// Functions that are not templates: declared where they were (a class's members in the class),
// defined in a block that only the units compiling them parse:
//   FUSEBOX_RUNTIME_API std::string describe(const plan_ref& p);     // `inline` header-only
//   ...
//   #if FUSEBOX_RUNTIME_BODIES
//   FUSEBOX_RUNTIME_API std::string describe(const plan_ref& p) { ... }
//   #endif
// Every unit of a program must agree on FUSEBOX_EXTERN_RUNTIME (one definition rule).
//
// FUSEBOX_HEADER_CHECK_FIRST_BODIES is for the header check only (tests/CMakeLists.txt: each
// header compiled alone, one unit each, with -fsyntax-only): there only the header the unit
// includes first (`__INCLUDE_LEVEL__` 1) parses its bodies; the headers it pulls in contribute
// declarations, as with FUSEBOX_EXTERN_RUNTIME, and their bodies are checked in their own units.
// A body that uses what its header does not include still fails its own unit; the check no
// longer parses every body below a header again in each unit above it (half of the heavier
// units' time). No program defines it: its bodies are not `inline`.
// Depends on: nothing.
#pragma once

#if defined(FUSEBOX_EXTERN_RUNTIME) && defined(FUSEBOX_IMPLEMENTATION)
#define FUSEBOX_RUNTIME_INSTANCE template
#elif defined(FUSEBOX_EXTERN_RUNTIME)
#define FUSEBOX_RUNTIME_INSTANCE extern template
#endif

#if defined(FUSEBOX_EXTERN_RUNTIME)
#define FUSEBOX_RUNTIME_API
#if defined(FUSEBOX_IMPLEMENTATION)
#define FUSEBOX_RUNTIME_BODIES 1
#else
#define FUSEBOX_RUNTIME_BODIES 0
#endif
#elif defined(FUSEBOX_HEADER_CHECK_FIRST_BODIES) && defined(__INCLUDE_LEVEL__)
#define FUSEBOX_RUNTIME_API
#define FUSEBOX_RUNTIME_BODIES (__INCLUDE_LEVEL__ == 1)
#else
#define FUSEBOX_RUNTIME_API inline
#define FUSEBOX_RUNTIME_BODIES 1
#endif
