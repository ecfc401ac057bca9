// plan/planner.hpp: the one planner. Nodes in, plan out: fusion groups, the kernel order, what
// each kernel keeps in a per-row scratch, and the arena offsets of every intermediate buffer.
//
// It is ordinary constexpr code over an array of IR nodes: for static shapes it runs while the
// model's translation unit is compiled (one constexpr object per expression type); for dynamic
// shapes the same functions run at run time. There is no second planner. Below it, the schedule
// (schedule/) makes the per-back-end decisions: merging dimensions, task splits, library epilogues.
//
// The passes, in order; each is a constexpr function of the working state (plan/planning.hpp) in
// a header of its own, with a check of what it promises that runs after it when asked
// (`checked`; by default when FUSEBOX_CHECK_PASSES is defined). tests/jit/fuzz_ir.cpp checks
// every plan it makes; a failed check is an exception naming the pass, in a static plan a build
// error. (Defining the macro for a whole test suite would cost its shared precompiled header.)
//
//   group        fusion groups: pointwise, rows (last-axis reductions), columns   plan/group.hpp
//   materialise  which nodes get memory                                           plan/materialise.hpp
//   epilogues    pointwise groups fused into the product they consume             plan/epilogues.hpp
//   order        kernels in dependency order; copies for outputs no kernel writes plan/order.hpp
//   twins        kernels a call skips when payload twins are one value            plan/twins.hpp
//   row_cache    reduction passes and the per-row scratch of each rows kernel     plan/row_cache.hpp
//   arena        buffer offsets by liveness (static shapes; else per call)        plan/arena.hpp
//
// Depends on: plan/{planning,group,materialise,epilogues,order,twins,row_cache,arena}.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/plan/arena.hpp"
#include "fusebox/plan/epilogues.hpp"
#include "fusebox/plan/group.hpp"
#include "fusebox/plan/materialise.hpp"
#include "fusebox/plan/order.hpp"
#include "fusebox/plan/plan.hpp"
#include "fusebox/plan/planning.hpp"
#include "fusebox/plan/row_cache.hpp"
#include "fusebox/plan/twins.hpp"

namespace fusebox::plan {

#ifdef FUSEBOX_CHECK_PASSES
inline constexpr bool check_passes = true;
#else
inline constexpr bool check_passes = false;
#endif

/// The whole planner. `outputs` are the model's results; `elem_bytes` the size of one element.
/// `with_twins`: plan for nodes of one type holding one value (ir::node::twin) being computed once,
/// which the runner checks per call; the run-time path has merged them before planning and
/// passes false. `checked`: run each pass's check after it.
template <std::size_t N, std::size_t R>
constexpr plan_t<N> make_plan(const std::array<ir::node, N>& nodes, const std::array<int, R>& outputs,
                              std::size_t elem_bytes, bool with_twins = false, bool checked = check_passes) {
  planning<N> s{nodes};
  s.twins = with_twins;
  s.elem_bytes = elem_bytes;
  for (std::size_t i = 0; i < N; ++i) {
    s.p.same_as[i] = s.p.cache_slot[i] = s.p.kernel_of[i] = -1;
    s.p.offset[i] = no_offset;
  }
  for (int o : outputs) s.p.is_output[o] = true;

  auto pass = [&s, checked](void (*run)(planning<N>&), void (*check)(planning<N>&)) {
    run(s);
    if (checked) check(s);
  };
  pass(group<N>, check_group<N>);
  pass(materialise<N>, check_materialise<N>);
  pass(epilogues<N>, check_epilogues<N>);
  order(s, outputs);
  if (checked) check_order(s);
  pass(twins<N>, check_twins<N>);
  pass(row_cache<N>, check_row_cache<N>);
  pass(arena<N>, check_arena<N>);
  return s.p;
}

}  // namespace fusebox::plan
