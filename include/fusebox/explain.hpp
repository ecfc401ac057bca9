// explain.hpp: explain(model, args...) says what compile() makes of a model for these arguments:
// the segments, the graph breaks with their source lines, and every kernel with its fused ops,
// loop, vector width, threads, bytes and flops. It runs the capture once (a graph break runs the
// part of the model before it), like torch._dynamo.explain.
// Depends on: compile.hpp.
#pragma once

#include <iostream>
#include <string>
#include <vector>

#include "fusebox/compile.hpp"

namespace fusebox {

/// The report as text; `explain` also prints it.
template <class Model, class... Args>
std::string explain_text(Model model, const Args&... args) {
  auto c = compile(std::move(model));
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

/// Prints what compile() makes of `model` for these arguments, and returns the text.
template <class Model, class... Args>
std::string explain(Model model, const Args&... args) {
  std::string s = explain_text(std::move(model), args...);
  std::cout << s << std::flush;
  return s;
}

}  // namespace fusebox
