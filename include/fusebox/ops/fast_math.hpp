// ops/fast_math.hpp: the ops options::fast_math changes on the host, as op types. fast_math_t<Op>
// is Op with its `apply` on fusebox::vmath::fast, or Op itself where there is nothing faster within
// Eigen's error (backend/cpu/vmath.hpp): today only gelu has a fast variant. The static executor
// evaluates fast_math_t<Op> when its program is built with fast math, and the run-time path's
// generated kernels spell `fusebox::ops::fast_math_t<fusebox::ops::NAME>`, so both paths run one
// definition. Gradients (the *_backward ops) and pow stay faithful.
// Depends on: ops/elementwise.hpp, backend/cpu/vmath.hpp.
#pragma once

#include "fusebox/backend/cpu/vmath.hpp"
#include "fusebox/ops/elementwise.hpp"

namespace fusebox::ops {

template <class Op>
struct fast_math_variant {
  using type = Op;
};
template <class Op>
using fast_math_t = typename fast_math_variant<Op>::type;

/// The op a program evaluates for Op: fast_math_t<Op> when FastMath, else Op.
template <bool FastMath, class Op>
using math_op_t = std::conditional_t<FastMath, fast_math_t<Op>, Op>;

namespace fast {
struct gelu : ops::gelu {
  template <class V>
  static V apply(const V& x) {
    return vmath::fast::gelu(x);
  }
};
}  // namespace fast

template <> struct fast_math_variant<gelu> { using type = fast::gelu; };

}  // namespace fusebox::ops
