// tests/support/gpu.hpp: the one way a [cuda] test case skips on a machine without a GPU: it says
// so (a Catch2 warning, visible in the run's output) and returns. Cases that can check something
// without a GPU (NVRTC compiles, refusals) do that before skipping instead.
// Depends on: fusebox's CUDA driver layer, Catch2.
#pragma once

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/backend/cuda/driver.hpp>

/// Ends the current test case or section, saying why, when no CUDA device is present.
#define FUSEBOX_REQUIRE_GPU()                                                   \
  do {                                                                          \
    if (!::fusebox::cuda::available()) {                                        \
      WARN("no CUDA device: skipped (the CUDA backend is unavailable here)");   \
      return;                                                                   \
    }                                                                           \
  } while (0)

namespace fbt {
/// NVRTC options of the sweeps without a GPU (the fuzzers, the capability matrix, special values):
/// the front end only, which reports every error of a generator's CUDA C++ (syntax, types, overloads,
/// an unknown intrinsic) without NVVM's optimiser and PTX. Those were 60% of jit.fuzz_ir's CPU time
/// (84 -> 32 CPU-s with it, issue 22). tests/cuda/compiled.cpp still takes every model's kernels down
/// to PTX, and on a GPU machine the sweeps build cubins.
inline const std::vector<std::string> nvrtc_front_end_only{"--fdevice-syntax-only"};
}  // namespace fbt
