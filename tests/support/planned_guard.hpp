// tests/support/planned_guard.hpp: the guard the run-time path would make for a first call of a
// program, built without a call, so tests and bench/render_dump.cpp can plan, schedule and render
// its kernels (even for the GPU on a machine without one).
// Depends on: fusebox.hpp (the whole library, so the header also builds against trees from before
// the guard moved to runtime/guard.hpp: bench/render_dump.cpp compares two versions).
#pragma once

#include <algorithm>
#include <cstddef>

#include <fusebox/fusebox.hpp>

namespace fbt {

/// Program Prog's guard with every dyn extent set to `rows` (0: a symbol, as after a second
/// batch size), every argument contiguous and aligned, and payloads of one type holding equal
/// values (as jit::payload_classes numbers a call's equal payloads; the models in the tests hold
/// literal scalars).
template <class Prog>
fusebox::jit::guard planned_guard(std::size_t rows) {
  namespace fb = fusebox;
  std::size_t args = 0;
  for (std::size_t i = 0; i < Prog::N; ++i)
    if (Prog::nodes[i].desc.kind == fb::node_kind::input)
      args = std::max(args, static_cast<std::size_t>(Prog::nodes[i].desc.input_index) + 1);
  fb::jit::guard g;
  g.pattern.assign(args, fb::dims{});
  for (std::size_t i = 0; i < Prog::N; ++i) {
    const auto& n = Prog::nodes[i];
    if (n.desc.kind != fb::node_kind::input) continue;
    fb::dims d = n.desc.shape;
    for (std::size_t k = 0; k < d.rank; ++k)
      if (d.extent[k] == fb::dyn) d.extent[k] = rows ? rows : fb::symbol(0);
    g.pattern[n.desc.input_index] = d;
  }
  g.unit_inner.assign(args, true);
  g.aligned.assign(args, true);
  g.payload_class.assign(Prog::N, -1);
  for (std::size_t i = 0; i < Prog::N; ++i) {
    if (Prog::nodes[i].payload_slot < 0 || !fb::ir::is_payload_kind(Prog::nodes[i].desc.kind)) continue;
    g.payload_class[i] = static_cast<int>(i);
    for (std::size_t j = 0; j < i; ++j)
      if (g.payload_class[j] == static_cast<int>(j) && Prog::nodes[j].type == Prog::nodes[i].type) {
        g.payload_class[i] = static_cast<int>(j);
        break;
      }
  }
  return g;
}

}  // namespace fbt
