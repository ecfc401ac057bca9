// errors.hpp: the exceptions fusebox throws. Each names what the user wrote (op, shapes) and
// where (the caller's source line), so a message alone is enough to fix the call.
//
// A build without exceptions (-fno-exceptions, as edge builds are: issue 23) cannot throw them.
// Every error fusebox raises goes through FUSEBOX_THROW, which there hands the error to the error
// handler (set_error_handler; the default prints the message to stderr and aborts) instead. Shape
// errors of static shapes are build errors in both. What such a build can include: <fusebox/cpu.hpp>
// and the checkpoint loader; the run-time path, CUDA, training and data headers need exceptions
// (their entry headers say so).
// Depends on: the standard library only.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define FUSEBOX_HAS_EXCEPTIONS 1
#else
#define FUSEBOX_HAS_EXCEPTIONS 0
#endif

namespace fusebox {

/// What a build without exceptions does with an error: called with it, must not return (abort,
/// reset the device, longjmp to a recovery point). Not called where exceptions exist.
using error_handler = void (*)(const std::exception& error);

namespace detail {
inline error_handler& error_handler_slot() noexcept {
  static error_handler handler = nullptr;
  return handler;
}

/// The end of an error in a build without exceptions: the handler, then (if there is none, or it
/// returned) the message on stderr and std::abort. The program's buffered output is flushed
/// first: abort would drop it, and it says how far the program got.
[[noreturn]] inline void unrecoverable(const std::exception& error) noexcept {
  if (const error_handler handler = error_handler_slot()) handler(error);
  std::fflush(nullptr);
  const std::string_view what = error.what();
  std::fprintf(stderr, "%s%s\n", what.starts_with("fusebox") ? "" : "fusebox: ", error.what());
  std::abort();
}
}  // namespace detail

/// Installs the handler of a build without exceptions and returns the previous one (nullptr: the
/// default). Thread-safe only before the first compiled call, as a program's setup is.
inline error_handler set_error_handler(error_handler handler) noexcept {
  const error_handler previous = detail::error_handler_slot();
  detail::error_handler_slot() = handler;
  return previous;
}
}  // namespace fusebox

/// Raises a fusebox error: `FUSEBOX_THROW(shape_error(message, loc));`. A throw where exceptions
/// exist; otherwise the error handler, which does not return.
#if FUSEBOX_HAS_EXCEPTIONS
#define FUSEBOX_THROW(...) throw __VA_ARGS__
#else
#define FUSEBOX_THROW(...) ::fusebox::detail::unrecoverable(__VA_ARGS__)
#endif

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
