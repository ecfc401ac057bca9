// Compile-fail: opaque(fn, x) inside a model compiled with compile<options{.fullgraph = true}>: a
// graph break, so a build error ("graph break under fullgraph", graph_break.hpp) with "required from
// here" at the opaque() call. Without FUSEBOX_SHOULD_FAIL the same model is compiled without
// fullgraph and builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
constexpr fb::options opts{.fullgraph = true};
#else
constexpr fb::options opts{};
#endif

auto twice = [](const auto& t) {
  auto out = t.clone();
  for (std::size_t i = 0; i < out.size(); ++i) out.flat(i) *= 2;
  return out;
};

auto model = [](auto x) { return fb::exp(fb::opaque(twice, x + 1.0)); };  // the misuse

void use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  auto y = fb::compile<opts>(model)(x);
  (void)y;
}
