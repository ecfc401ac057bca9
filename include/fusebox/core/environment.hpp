// core/environment.hpp: where the static path reads the process environment (FUSEBOX_DISABLE,
// FUSEBOX_LOGS, FUSEBOX_FORBID_COMPILES, FUSEBOX_CONV_WINOGRAD). With FUSEBOX_NO_ENVIRONMENT
// defined (edge builds, issue 23: a device may have no environment, and a deployed model should
// not change with one) every such setting keeps its default and the program links no getenv. The
// run-time path and the CUDA back end need their environment (PATH, HOME, CUDA_HOME, ...):
// <fusebox/jit.hpp> refuses FUSEBOX_NO_ENVIRONMENT.
// Depends on: the standard library only.
#pragma once

#include <cstdlib>

namespace fusebox::detail {

/// The value of environment variable `name`, or nullptr when it is unset or this build reads none.
inline const char* environment_variable(const char* name) noexcept {
#if defined(FUSEBOX_NO_ENVIRONMENT)
  (void)name;
  return nullptr;
#else
  return std::getenv(name);
#endif
}

}  // namespace fusebox::detail
