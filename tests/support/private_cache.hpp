// tests/support/private_cache.hpp: a test binary's own kernel cache directory, removed at exit.
// FUSEBOX_CACHE_DIR is read when the process's kernel store is first used, so one directory
// serves the whole binary; generated kernels build at -O1 (they are checked for results here,
// not timed), and the precompiled prelude comes from the CTest fixture's seed (prelude_seed.hpp).
#pragma once

#include <cstdlib>

#include <fusebox/fusebox.hpp>

#include "prelude_seed.hpp"

namespace fbt {

/// Call at the start of every test case that compiles kernels; `prefix` names the directory.
inline void use_private_cache(const char* prefix) {
  struct guard {
    fusebox::jit::temp_directory dir;
    explicit guard(const char* p) : dir(fusebox::jit::detail::temp_root(), p) {
      ::setenv("FUSEBOX_CACHE_DIR", dir.path().c_str(), 1);
      ::setenv("FUSEBOX_CXXFLAGS", "-O1", 1);
      seed_prelude(dir.path());
    }
  };
  static guard g(prefix);
}

}  // namespace fbt
