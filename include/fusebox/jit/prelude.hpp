// jit/prelude.hpp: what every generated CPU kernel includes (and what the host compiler may keep
// as a precompiled header): the op definitions, the vector load/store helpers, the kernel ABI.
// Depends on: ops/{elementwise,fast_math,reduce}.hpp, backend/cpu/simd.hpp, jit/kernel_abi.hpp.
#pragma once

#include <cstddef>

#include "fusebox/backend/cpu/simd.hpp"
#include "fusebox/jit/kernel_abi.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/fast_math.hpp"
#include "fusebox/ops/reduce.hpp"
