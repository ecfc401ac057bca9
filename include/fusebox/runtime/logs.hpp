// fusebox/runtime/logs.hpp: the `FUSEBOX_LOGS` switchboard (DESIGN.md: every miss and every
// recompile says why).
//
// Categories are bit flags: recompiles, guards, graph_breaks, kernels, cache, output_code,
// autotune, cudagraphs, rollback. They are read once from the environment
// (`FUSEBOX_LOGS=recompiles,cache`; also `all`; an unknown name warns once and is ignored), at
// start-up: every program that includes this header reads them before main, so a static-only
// program, which may never log, still warns about a misspelt name. They can be replaced from code with
// `fusebox::set_logs("recompiles,cache")`. `log(category, message)` writes each line of the
// message to stderr as `[fusebox:<category>] <line>`, one line per write under a lock, so lines
// from several threads never interleave. When a category is off, `enabled()` is one relaxed
// atomic load: test it before building an expensive message.
//
// Depends on: the C++20 standard library and fusebox/core/{environment,linkage,lock}.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "fusebox/core/environment.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/lock.hpp"

namespace fusebox::jit {

enum class log_category : std::uint32_t {
  recompiles = 1u << 0,
  guards = 1u << 1,
  graph_breaks = 1u << 2,
  kernels = 1u << 3,
  cache = 1u << 4,
  output_code = 1u << 5,
  autotune = 1u << 6,
  cudagraphs = 1u << 7,
  rollback = 1u << 8,  ///< a compiled function runs eagerly (f.disable(), force_eager, FUSEBOX_DISABLE)
};

namespace detail {

struct log_name {
  log_category category;
  std::string_view name;
};
inline constexpr log_name log_names[] = {
    {log_category::recompiles, "recompiles"}, {log_category::guards, "guards"},
    {log_category::graph_breaks, "graph_breaks"}, {log_category::kernels, "kernels"},
    {log_category::cache, "cache"}, {log_category::output_code, "output_code"},
    {log_category::autotune, "autotune"}, {log_category::cudagraphs, "cudagraphs"},
    {log_category::rollback, "rollback"},
};
inline constexpr std::uint32_t all_log_bits = (1u << 9) - 1;

inline void write_stderr_line(std::string_view line) {
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

struct log_state {
  ::fusebox::detail::state_mutex mutex;  // serialises output and guards `sink` and `warned`
  std::function<void(std::string_view)> sink;  // empty: stderr
  std::set<std::string, std::less<>> warned;   // unknown names already reported
  std::atomic<std::uint32_t> mask{0};

  void warn_unknown(std::string_view name);

  void emit(std::string_view line) {
    ::fusebox::detail::state_lock lock(mutex);
    if (sink)
      sink(line);
    else
      write_stderr_line(line);
  }
};

FUSEBOX_RUNTIME_API std::uint32_t parse_logs(std::string_view list, log_state& state);

inline log_state& logs() {
  // Constructed on first use (thread-safe), reading the environment once.
  static log_state* state = [] {
    auto* s = new log_state;  // never destroyed: logging may happen during static destruction
    if (const char* env = ::fusebox::detail::environment_variable("FUSEBOX_LOGS"))
      s->mask.store(parse_logs(env, *s), std::memory_order_relaxed);
    return s;
  }();
  return *state;
}

/// Reads FUSEBOX_LOGS during static initialisation of any program that includes this header:
/// otherwise it was read on the first log or enabled() call, which a program on the static path
/// alone may never make, and a misspelt category went unreported.
inline const bool logs_read_at_start_up = (logs(), true);

}  // namespace detail

/// The name of a category as FUSEBOX_LOGS spells it.
constexpr std::string_view category_name(log_category category) noexcept {
  for (const auto& entry : detail::log_names)
    if (entry.category == category) return entry.name;
  return "unknown";
}

inline bool enabled(log_category category) noexcept {
  return (detail::logs().mask.load(std::memory_order_relaxed) &
          static_cast<std::uint32_t>(category)) != 0;
}

/// Replaces the enabled set with a FUSEBOX_LOGS-style list ("" turns everything off).
inline void set_logs(std::string_view list) {
  auto& state = detail::logs();
  state.mask.store(detail::parse_logs(list, state), std::memory_order_relaxed);
}

/// Turns one category on or off, leaving the others.
FUSEBOX_RUNTIME_API void set_log(log_category category, bool on);

/// Where log lines go: each call receives one complete line, ending in '\n', under the log lock
/// (so the sink needs no locking of its own and must not log). An empty function restores
/// stderr. For tests and for programs that route diagnostics elsewhere.
FUSEBOX_RUNTIME_API void set_log_sink(std::function<void(std::string_view)> sink);

/// Writes `message` if `category` is enabled, one `[fusebox:<category>] ` prefixed line per line
/// of the message.
FUSEBOX_RUNTIME_API void log(log_category category, std::string_view message);

/// A warning that is always shown (not gated by a category): `[fusebox] warning: ...`.
inline void warn(std::string_view message) {
  detail::logs().emit("[fusebox] warning: " + std::string(message) + "\n");
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {

FUSEBOX_RUNTIME_API void log_state::warn_unknown(std::string_view name) {
  std::string line;
  {
    ::fusebox::detail::state_lock lock(mutex);
    if (!warned.emplace(name).second) return;
    line = "[fusebox] warning: FUSEBOX_LOGS: unknown category '" + std::string(name) +
           "' ignored (known: recompiles, guards, graph_breaks, kernels, cache, output_code, "
           "autotune, cudagraphs, rollback, all)\n";
  }
  emit(line);
}

FUSEBOX_RUNTIME_API std::uint32_t parse_logs(std::string_view list, log_state& state) {
  std::uint32_t bits = 0;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (item.empty()) continue;
    if (item == "all") {
      bits |= all_log_bits;
      continue;
    }
    bool known = false;
    for (const auto& entry : log_names)
      if (entry.name == item) {
        bits |= static_cast<std::uint32_t>(entry.category);
        known = true;
      }
    if (!known) state.warn_unknown(item);
  }
  return bits;
}

}  // namespace detail

FUSEBOX_RUNTIME_API void set_log(log_category category, bool on) {
  auto& mask = detail::logs().mask;
  const auto bit = static_cast<std::uint32_t>(category);
  if (on)
    mask.fetch_or(bit, std::memory_order_relaxed);
  else
    mask.fetch_and(~bit, std::memory_order_relaxed);
}

FUSEBOX_RUNTIME_API void set_log_sink(std::function<void(std::string_view)> sink) {
  auto& state = detail::logs();
  ::fusebox::detail::state_lock lock(state.mutex);
  state.sink = std::move(sink);
}

FUSEBOX_RUNTIME_API void log(log_category category, std::string_view message) {
  if (!enabled(category)) return;
  const std::string prefix = "[fusebox:" + std::string(category_name(category)) + "] ";
  std::string text;
  do {
    const std::size_t newline = message.find('\n');
    text += prefix;
    text.append(message.substr(0, newline));
    text.push_back('\n');
    message = newline == std::string_view::npos ? std::string_view{} : message.substr(newline + 1);
  } while (!message.empty());
  auto& state = detail::logs();
  // The lock is held across every line, so a multi-line message (output_code) stays in one
  // piece; stderr gets it in one write, a sink one line per call.
  ::fusebox::detail::state_lock lock(state.mutex);
  if (!state.sink) {
    detail::write_stderr_line(text);
    return;
  }
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t end = rest.find('\n') + 1;
    state.sink(rest.substr(0, end));
    rest.remove_prefix(end);
  }
}
#endif

}  // namespace fusebox::jit

namespace fusebox {
using jit::set_logs;
}  // namespace fusebox
