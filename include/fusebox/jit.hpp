// fusebox/jit.hpp: <fusebox/cpu.hpp> and the run-time path on the CPU: dyn extents (guards,
// specialisation, kernels generated as C++ and compiled by the host compiler, the kernel caches),
// and max_autotune's winners kept on disk.
#pragma once

#include "fusebox/core/errors.hpp"
#if !FUSEBOX_HAS_EXCEPTIONS
#error "fusebox: <fusebox/jit.hpp> (the run-time path: dyn extents, the kernel caches) needs C++ exceptions; a build with -fno-exceptions can use <fusebox/cpu.hpp> (static shapes on the CPU) and <fusebox/io/safetensors.hpp> (core/errors.hpp)"
#endif
#if defined(FUSEBOX_NO_ENVIRONMENT)
#error "fusebox: <fusebox/jit.hpp> (the run-time path) reads its environment (PATH, HOME, FUSEBOX_CXX, ...); FUSEBOX_NO_ENVIRONMENT is for programs of static shapes from <fusebox/cpu.hpp> (core/environment.hpp)"
#endif

#include "fusebox/backend/cpu/winner_store.hpp"
#include "fusebox/cpu.hpp"
#include "fusebox/pipeline/dynamic_function.hpp"
