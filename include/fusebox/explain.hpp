// explain.hpp: explain(model, args...) says what compile() makes of a model for these arguments:
// the segments, the graph breaks with their source lines, and every kernel with its fused ops,
// loop, vector width, threads, bytes and flops. It runs the capture once (a graph break runs the
// part of the model before it), like torch._dynamo.explain. Given options, it ends with what each
// compile mode does on the CPU, the one given marked.
// Depends on: compile.hpp.
#pragma once

#include <iostream>
#include <string>
#include <vector>

#include "fusebox/compile.hpp"

namespace fusebox {

namespace detail {

/// What each mode does on the CPU (host tensors), the one `o` selects marked. Said even where a
/// mode does nothing: a mode accepted and silently ignored is worse than one explained.
inline std::string cpu_modes_text(const options& o) {
  auto mark = [&](mode m) { return std::string(o.mode == m ? " (this compile)" : ""); };
  return std::string("modes on the CPU:\n") + "  default_" + mark(mode::default_) +
         ": each call of the run-time path (dyn extents) checks the guards and specialises the plan to its "
         "extents; kernels take their rules (gemm path and grid, direct or Winograd convolution, rows per task)\n" +
         "  reduce_overhead" + mark(mode::reduce_overhead) +
         ": on the run-time path an exact repeat of one of the last " +
         std::to_string(jit::fast_path_signatures) +
         " call signatures (extents, inner strides, alignment, which scalars are equal) skips the guards, the "
         "hint checks and the specialisation (counters().fast_path_calls); static shapes have no guard or "
         "specialisation per call, so there it changes nothing; no CUDA graphs on the CPU\n" +
         "  max_autotune" + mark(mode::max_autotune) + ": reduce_overhead, plus timed choices per problem: " +
         cpu::autotune::description() + "; winners kept in memory and in " + jit::cpu_winner_store::instance().where() +
         ", so a later process times nothing (FUSEBOX_LOGS=autotune, counters().autotune_timed / "
         "autotune_from_disk); the run-time path's generated row and column kernels are not tuned\n";
}

template <class Model, class... Args>
std::string explain_report(Model model, const options& opts, const Args&... args) {
  auto c = compile(std::move(model), opts);
  std::vector<detail::break_record> breaks;
  const std::string last = c.describe(&breaks, args...);
  int opaque = 0;
  for (const auto& b : breaks) opaque += b.what == "opaque()";
  const int segments = 1 + static_cast<int>(breaks.size());
  std::string s = "fusebox::explain: " + std::to_string(segments) + " segment(s), " +
                  std::to_string(breaks.size()) + " graph break(s)\n";
  for (const auto& b : breaks) s += "  graph break: " + b.what + " at " + where(b.loc) + "\n";
  int k = 1;
  for (const auto& b : breaks) {
    if (!b.segment_report) continue;
    s += "segment " + std::to_string(k++) + " (runs at the break, to produce the value " + b.what + " reads):\n";
    s += b.segment_report();
  }
  s += "segment " + std::to_string(k) + " (the model's result" +
       (opaque ? std::string(", split at opaque() calls into ") + std::to_string(opaque + 1) + " parts" : std::string()) +
       "):\n" + last;
  return s;
}

}  // namespace detail

/// The report as text; `explain` also prints it. With `opts`, for compile(model, opts), ending
/// with what each mode does on the CPU.
template <class Model, class... Args>
std::string explain_text(Model model, const options& opts, const Args&... args) {
  return detail::explain_report(std::move(model), opts, args...) + detail::cpu_modes_text(opts);
}

/// Without options: default mode. Its last line points at the form above. (Deliberately short:
/// tests of other features count words in this report.)
template <class Model, class... Args>
std::string explain_text(Model model, const Args&... args) {
  return detail::explain_report(std::move(model), options{}, args...) +
         "mode default_ (explain(model, options, args...) says what every mode does on the CPU)\n";
}

/// Prints what compile() makes of `model` for these arguments, and returns the text.
template <class Model, class... Args>
std::string explain(Model model, const Args&... args) {
  std::string s = explain_text(std::move(model), args...);
  std::cout << s << std::flush;
  return s;
}

}  // namespace fusebox
