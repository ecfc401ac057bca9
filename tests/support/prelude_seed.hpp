// tests/support/prelude_seed.hpp: a test's fresh kernel cache starts with the precompiled kernel
// prelude that the CTest fixture jit.prelude_seed built once (tests/CMakeLists.txt), instead of
// each test process building its own (~4 CPU-s each; eight processes did, the test step's largest
// share of host compiles after fuzz_ir's kernels). The entry is copied, not linked, so a test that
// damages its cache cannot touch the seed; the kernel store checks it as any entry (key in full,
// size, SHA-256) and rebuilds it if it does not match (another compiler, other flags, edited
// headers). Without FUSEBOX_TEST_PRELUDE_SEED (a test run outside CTest), or on any error, the test
// builds its own prelude, as a program does.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace fbt {

/// Copies every artifact entry of the seed cache (the prelude is its only one) into `cache_dir`,
/// a cache directory no process has used yet.
inline void seed_prelude(const std::filesystem::path& cache_dir) {
  namespace fs = std::filesystem;
  const char* seed = std::getenv("FUSEBOX_TEST_PRELUDE_SEED");
  if (seed == nullptr || *seed == '\0') return;
  std::error_code ec;
  const fs::path from = fs::path(seed) / "v1" / "artifacts";
  for (const auto& entry : fs::directory_iterator(from, ec)) {
    const fs::path to = cache_dir / "v1" / "artifacts" / entry.path().filename();
    // 0700, as the disk cache makes its own directories.
    for (const fs::path& d : {cache_dir / "v1", cache_dir / "v1" / "artifacts", to}) {
      fs::create_directory(d, ec);
      fs::permissions(d, fs::perms::owner_all, ec);
    }
    for (const char* file : {"key", "meta", "artifact.so"}) fs::copy_file(entry.path() / file, to / file, ec);
  }
}

}  // namespace fbt
