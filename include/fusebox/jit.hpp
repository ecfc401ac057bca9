// fusebox/jit.hpp: <fusebox/cpu.hpp> and the run-time path on the CPU: dyn extents (guards,
// specialisation, kernels generated as C++ and compiled by the host compiler, the kernel caches),
// and max_autotune's winners kept on disk.
#pragma once

#include "fusebox/backend/cpu/winner_store.hpp"
#include "fusebox/cpu.hpp"
#include "fusebox/pipeline/dynamic_function.hpp"
