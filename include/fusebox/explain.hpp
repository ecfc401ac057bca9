// explain.hpp: explain(model, args...) says what compile() makes of a model for these arguments:
// the segments, the graph breaks with their source lines, and every kernel with its fused ops,
// loop, bytes and flops, and how the back end runs it (vector width and threads, a generated
// kernel, a library call), on every path: static or run-time, CPU or CUDA (pipeline/call.hpp).
// It runs the capture once (a graph break runs the part of the model before it), like
// torch._dynamo.explain. Given options, it ends with what each
// compile mode does on that back end, the one given marked.
// Depends on: compile.hpp.
#pragma once

#include <iostream>
#include <string>
#include <vector>

#include "fusebox/compile.hpp"

namespace fusebox {

namespace detail {

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
/// with what each mode does on the back end the arguments choose (host tensors: the CPU; device
/// tensors: the GPU).
template <class Model, class... Args>
std::string explain_text(Model model, const options& opts, const Args&... args) {
  using B = typename compiled<Model>::template backend_for<Args...>;
  return detail::explain_report(std::move(model), opts, args...) + B::modes_text(opts);
}

/// Without options: default mode. Its last line points at the form above. (Deliberately short:
/// tests of other features count words in this report.)
template <class Model, class... Args>
std::string explain_text(Model model, const Args&... args) {
  return detail::explain_report(std::move(model), options{}, args...) +
         "mode default_ (explain(model, options, args...) says what every mode does here)\n";
}

/// Prints what compile() makes of `model` for these arguments, and returns the text.
template <class Model, class... Args>
std::string explain(Model model, const Args&... args) {
  std::string s = explain_text(std::move(model), args...);
  std::cout << s << std::flush;
  return s;
}

}  // namespace fusebox
