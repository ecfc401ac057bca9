// The consumer's second unit, in the library that fusebox_precompile_headers() makes the
// precompiled header in (built in the subdirectory form only). It includes fusebox as any unit
// would; with the helper that #include is already satisfied by the force-included header.
// install-and-consume.cmake checks that this unit and main.cpp read one precompiled header and that
// GCC did not reject it (-Winvalid-pch).
#include <fusebox/cpu.hpp>

float consumer_part_sum() {
  fusebox::tensor<float, fusebox::shape<2, 3>> x;
  float sum = 0.0f;
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      x(i, j) = static_cast<float>(3 * i + j + 1);
      sum += x(i, j) * x(i, j);
    }
  return sum;  // 1 + 4 + ... + 36 = 91, exact in float
}
