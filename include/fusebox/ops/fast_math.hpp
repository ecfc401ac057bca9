// ops/fast_math.hpp: the ops options::fast_math changes on the host, as op types. fast_math_t<Op>
// is Op with its `apply` on fusebox::vmath::fast (approximate float transcendentals, see
// backend/cpu/vmath.hpp), or Op itself where there is nothing faster. The static executor evaluates
// fast_math_t<Op> when its program is built with fast math, and the run-time path's generated
// kernels spell `fusebox::ops::fast_math_t<fusebox::ops::NAME>`, so both paths run one definition.
// Gradients (the *_backward ops) and pow stay faithful.
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
#define FUSEBOX_FAST_UNARY_OP(op_name)                             \
  struct op_name : ops::op_name {                                  \
    template <class V>                                             \
    static V apply(const V& x) {                                   \
      return vmath::fast::op_name(x);                              \
    }                                                              \
  };
FUSEBOX_FAST_UNARY_OP(exp)
FUSEBOX_FAST_UNARY_OP(log)
FUSEBOX_FAST_UNARY_OP(tanh)
FUSEBOX_FAST_UNARY_OP(sigmoid)
FUSEBOX_FAST_UNARY_OP(gelu)
FUSEBOX_FAST_UNARY_OP(gelu_tanh)
FUSEBOX_FAST_UNARY_OP(silu)
#undef FUSEBOX_FAST_UNARY_OP
}  // namespace fast

template <> struct fast_math_variant<exp> { using type = fast::exp; };
template <> struct fast_math_variant<log> { using type = fast::log; };
template <> struct fast_math_variant<tanh> { using type = fast::tanh; };
template <> struct fast_math_variant<sigmoid> { using type = fast::sigmoid; };
template <> struct fast_math_variant<gelu> { using type = fast::gelu; };
template <> struct fast_math_variant<gelu_tanh> { using type = fast::gelu_tanh; };
template <> struct fast_math_variant<silu> { using type = fast::silu; };

}  // namespace fusebox::ops
