// fusebox/backend/cpu/cache_sizes.hpp: the host's cache sizes, for blocking choices that depend on
// the machine rather than on the vector ISA (gemm.hpp: case 4's loop order). Read once, at the
// first call; 0 where the system does not say (then callers keep their ISA defaults).
#pragma once

#include <cstddef>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace fusebox::cpu {

// Bytes of one core's L2 (glibc reads them from CPUID: 512 KiB on the Zen 3 of docs/benchmarks.md's
// runs AR-AW, 2 MiB inside the Xeon VM of runs AV-AW; lscpu showed 1 MiB on the Zen 4), or 0.
inline std::size_t l2_cache_bytes() noexcept {
  static const std::size_t bytes = []() -> std::size_t {
#if defined(__linux__) && defined(_SC_LEVEL2_CACHE_SIZE)
    const long v = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? std::size_t(v) : 0;
#else
    return 0;
#endif
  }();
  return bytes;
}

}  // namespace fusebox::cpu
