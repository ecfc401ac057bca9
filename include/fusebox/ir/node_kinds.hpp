// ir/node_kinds.hpp: what every stage below capture needs to know about a kind of node, in one
// table. The planner, the schedule and the runners ask the table ("is it fused?", "which kernel
// computes it?", "does it need arena memory?") instead of keeping their own lists of kinds, so a
// new node kind is one enumerator (expr/node.hpp), one row here and its own files. A custom op
// (expr/custom.hpp) needs not even that: its node carries its own shape rule and kernels.
// Depends on: expr/node.hpp.
#pragma once

#include <cstdint>

#include "fusebox/expr/node.hpp"

namespace fusebox::ir {

/// The kinds of kernel a plan is made of (plan/planner.hpp): `rows` and `reduce_cols` are fusion
/// groups the code generators write; the rest run one node each (a library call or a fixed kernel,
/// possibly with a generated epilogue), and `copy` writes an output no kernel produces.
enum class kernel_kind : std::uint8_t { rows, reduce_cols, matmul, opaque, copy, attention, spatial, pad, gather, custom };

constexpr const char* name(kernel_kind k) {
  constexpr const char* names[] = {"rows",      "reduce_cols", "matmul", "opaque", "copy",
                                   "attention", "spatial",     "pad",    "gather", "custom"};
  return names[static_cast<int>(k)];
}

struct node_kind_traits {
  node_kind kind;
  const char* name;
  bool leaf;             ///< no inputs; its memory or value is bound by the call (input, tensor, scalar)
  bool payload;          ///< holds a run-time value the call reads through its payload table
  bool fused;            ///< the planner groups it with its neighbours into rows / reduce_cols kernels
  bool own_kernel;       ///< computed alone by a kernel of kind `kernel`
  kernel_kind kernel;    ///< own_kernel: which
  bool takes_epilogue;   ///< own_kernel: calls a fused pointwise epilogue on finished output rows
  bool alias;            ///< its memory is its input's with other strides (views)
  bool written_elsewhere;///< its result is not written into arena or output memory by a plan kernel
                         ///< (leaves, views, a user function's result): as an output it is copied
};

// Kept in the order of node_kind; the static_assert below checks it.
inline constexpr node_kind_traits node_kind_table[] = {
    //  kind                  name         leaf   payload fused  own    kernel                    epilogue alias  elsewhere
    {node_kind::input,     "input",     true,  false, false, false, kernel_kind::copy,        false, false, true},
    {node_kind::tensor,    "tensor",    true,  true,  false, false, kernel_kind::copy,        false, false, true},
    {node_kind::scalar,    "scalar",    true,  true,  false, false, kernel_kind::copy,        false, false, true},
    {node_kind::pointwise, "pointwise", false, false, true,  false, kernel_kind::rows,        false, false, false},
    {node_kind::reduce,    "reduce",    false, false, true,  false, kernel_kind::rows,        false, false, false},
    {node_kind::matmul,    "matmul",    false, false, false, true,  kernel_kind::matmul,      true,  false, false},
    {node_kind::view,      "view",      false, false, false, false, kernel_kind::copy,        false, true,  true},
    {node_kind::opaque,    "opaque",    false, true,  false, true,  kernel_kind::opaque,      false, false, true},
    {node_kind::attention, "attention", false, false, false, true,  kernel_kind::attention,   false, false, false},
    {node_kind::spatial,   "spatial",   false, false, false, true,  kernel_kind::spatial,     true,  false, false},
    {node_kind::pad,       "pad",       false, false, false, true,  kernel_kind::pad,         false, false, false},
    {node_kind::gather,    "gather",    false, false, false, true,  kernel_kind::gather,      false, false, false},
    {node_kind::custom,    "custom",    false, false, false, true,  kernel_kind::custom,      false, false, false},
};

constexpr bool node_kind_table_in_order() {
  int i = 0;
  for (const node_kind_traits& t : node_kind_table)
    if (static_cast<int>(t.kind) != i++) return false;
  return i == static_cast<int>(node_kind::custom) + 1;
}
static_assert(node_kind_table_in_order(), "fusebox internal: ir::node_kind_table must list every node_kind in order");

constexpr const node_kind_traits& traits(node_kind k) { return node_kind_table[static_cast<int>(k)]; }

constexpr bool is_payload_kind(node_kind k) { return traits(k).payload; }
constexpr bool is_leaf_kind(node_kind k) { return traits(k).leaf; }

/// Whether a node of this kind always has memory of its own or bound by the call: a leaf, a view,
/// and a node computed by a kernel of its own (a library call reads and writes memory).
constexpr bool always_in_memory(node_kind k) { return traits(k).leaf || traits(k).alias || traits(k).own_kernel; }

/// Whether a node's operands must be in memory: a kernel of its own reads them there; a view
/// looks at its input's memory.
constexpr bool reads_operands_from_memory(node_kind k) { return traits(k).own_kernel || traits(k).alias; }

}  // namespace fusebox::ir
