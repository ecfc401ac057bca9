// errors.hpp: the exceptions fusebox throws. Each names what the user wrote (op, shapes) and
// where (the caller's source line), so a message alone is enough to fix the call.
// Depends on: the standard library only.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace fusebox {

/// "file.cpp:12" for messages.
inline std::string where(const std::source_location& loc) {
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}

/// Base of every fusebox error.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Shapes that do not fit an op, found at run time (static shapes fail the build instead).
struct shape_error : error {
  shape_error(const std::string& what, const std::source_location& loc)
      : error(loc.line() ? what + " (at " + where(loc) + ")" : what) {}
};

/// A graph break under `fullgraph`, or a break that cannot be honoured.
struct graph_break : error {
  graph_break(const std::string& what, const std::source_location& loc)
      : error("graph break: " + what + " (at " + where(loc) + ")") {}
};

/// Bad arguments to a fusebox entry point (not a shape problem): misaligned memory, empty inputs.
struct invalid_argument : error {
  using error::error;
};

/// A backend that cannot run in this process: its run-time libraries are missing or too old, or
/// there is no device. The message names the backend, what was tried (library names and the
/// loader's errors, or "no CUDA device") and how to fix it. Thrown when the backend is used, never
/// at start-up: a program built with CUDA support still runs its CPU work (DESIGN.md).
struct backend_unavailable : error {
  backend_unavailable(const std::string& backend, const std::string& tried, const std::string& fix)
      : error("fusebox: the " + backend + " backend is unavailable: " + tried +
              (fix.empty() ? std::string() : ". To fix: " + fix)) {}
};

}  // namespace fusebox
