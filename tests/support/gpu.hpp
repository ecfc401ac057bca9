// tests/support/gpu.hpp: the one way a [cuda] test case skips on a machine without a GPU: it says
// so (a Catch2 warning, visible in the run's output) and returns. Cases that can check something
// without a GPU (NVRTC compiles, refusals) do that before skipping instead.
// Depends on: fusebox's CUDA driver layer, Catch2.
#pragma once

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
