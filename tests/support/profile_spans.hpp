// tests/support/profile_spans.hpp: the names of the kernel spans the profiler records while a
// piece of code runs (fusebox/profile.hpp): how a test sees which kernels a call ran, and under
// which names.
// Depends on: fusebox/profile.hpp.
#pragma once

#include <string>
#include <vector>

#include <fusebox/profile.hpp>

namespace fbt {

/// Names of the kernel spans recorded by the last profile session.
inline std::vector<std::string> kernel_spans() {
  std::vector<std::string> names;
  for (const auto& e : fusebox::profile::events())
    if (!e.instant && e.category == "kernel") names.push_back(e.name);
  return names;
}

/// Runs f() while the profiler records; returns the kernel spans' names. (Device work: f
/// synchronises if the spans must cover it; spans are recorded where kernels are queued.)
template <class F>
std::vector<std::string> profiled(F&& f) {
  fusebox::profile::clear();
  fusebox::profile::start();
  f();
  fusebox::profile::stop();
  auto names = kernel_spans();
  fusebox::profile::clear();
  return names;
}

}  // namespace fbt
