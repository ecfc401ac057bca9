// expr/static_checks.hpp: build errors for shapes that cannot work, worded for the user.
//
// A static_assert message cannot print numbers, so each check is a class template whose name and
// arguments carry the op and both shapes: the compiler prints "In instantiation of
// 'fusebox::static_check::cannot_broadcast<fusebox::ops::add, fusebox::shape<3, 4>,
// fusebox::shape<5>, false>'" above the message, and "required from here" at the user's line.
// Depends on: <cstddef>.
#pragma once

#include <cstddef>

namespace fusebox::static_check {

template <class Op, class ShapeA, class ShapeB, bool Ok>
struct cannot_broadcast {
  static_assert(Ok,
                "fusebox: elementwise op: the operand shapes (template arguments above: op, shape of a, "
                "shape of b) cannot broadcast; NumPy rules: align the shapes on the right, each pair of extents "
                "must be equal or one of them 1. Fix: reshape or transpose one operand so they line up");
  static constexpr bool value = Ok;
};

template <class ShapeA, class ShapeB, bool Ok>
struct matmul_inner_mismatch {
  static_assert(Ok,
                "fusebox: matmul(a, b): a is [.., M, K] and b is [.., K, N] (shapes above): the inner extents K "
                "must match. Fix: if b holds [N, K] (a PyTorch Linear weight), use matmul(a, transpose(b))");
  static constexpr bool value = Ok;
};

template <class ShapeA, class ShapeB, bool Ok>
struct matmul_rank {
  static_assert(Ok,
                "fusebox: matmul(a, b): a and b need rank 2 or 3 ([M, K] or [batch, M, K]), and batch extents "
                "that are equal or 1 (shapes above). Fix: reshape to merge leading dimensions");
  static constexpr bool value = Ok;
};

template <class Op, class Shape, int Axis, bool Ok>
struct bad_axis {
  static_assert(Ok, "fusebox: reduction or softmax: the axis (above) is not a dimension of the operand shape "
                    "(above); use -1 for the last dimension");
  static constexpr bool value = Ok;
};

template <class A, class B, bool Ok>
struct mixed_element_types {
  static_assert(Ok, "fusebox: elementwise op: operands hold different element types (above: float and double); "
                    "use tensors of one element type in a model");
  static constexpr bool value = Ok;
};

template <class Shape, class NewShape, bool Ok>
struct reshape_size_mismatch {
  static_assert(Ok, "fusebox: reshape<S>(x): the new shape must hold as many elements as the old one (shapes "
                    "above)");
  static constexpr bool value = Ok;
};

template <class Shape, std::size_t Axis, std::size_t Begin, std::size_t End, bool Ok>
struct slice_out_of_range {
  static_assert(Ok, "fusebox: slice<Axis, Begin, End>(x): need Begin < End <= the extent of dimension Axis of x "
                    "(x's shape, Axis, Begin and End above)");
  static constexpr bool value = Ok;
};

template <class ShapeQ, class ShapeK, class ShapeV, bool Ok>
struct attention_shapes {
  static_assert(Ok,
                "fusebox: attention(q, k, v): q, k and v are [batch, tokens, heads, head dim] (shapes above): batch "
                "and heads must be equal, k and v must have the same tokens, q and k the same head dim. Fix: for "
                "[batch, heads, tokens, head dim] tensors (PyTorch's SDPA layout), pass transpose<1, 2>(q) etc.");
  static constexpr bool value = Ok;
};

template <class ShapeQ, class ShapeK, bool Ok>
struct attention_causal {
  static_assert(Ok,
                "fusebox: attention(q, k, v, causal): a causal mask needs as many queries as keys (q and k shapes "
                "above); for queries that continue a longer key sequence, pass the mask as part of the model");
  static constexpr bool value = Ok;
};

template <class Op, class ShapeA, class ShapeB, int Error>
struct spatial_shapes {
  static_assert(Error != 1,
                "fusebox: conv2d / max_pool2d / avg_pool2d: operands are NCHW [batch, channels, height, width] and a "
                "conv weight is OIHW [out channels, in channels, kernel h, kernel w] (op and shapes above): rank 4 "
                "each. Fix: reshape a flat image batch [N, H*W] to [N, 1, H, W]");
  static_assert(Error != 2,
                "fusebox: conv2d(x, w): x's channels (dimension 1, shape above) must equal w's in-channels "
                "(dimension 1 of the OIHW weight). Fix: the previous layer's out-channels are this layer's "
                "in-channels; a weight stored [in, out, kh, kw] needs transpose<0, 1>(w)");
  static_assert(Error != 3,
                "fusebox: conv2d / pooling: the window does not fit (op above: stride, padding; shapes above): need "
                "height + 2 * padding >= kernel, stride >= 1, padding >= 0, and for pooling padding at most half "
                "the window. Fix: more padding, a smaller kernel, or a larger input");
  static_assert(Error != 4,
                "fusebox: conv2d / pooling gradient op: the gradient's shape (above) does not match the forward "
                "call's");
  static constexpr bool value = Error == 0;
};

}  // namespace fusebox::static_check
