// Compile-fail: item(x) (a host read of a captured value) inside a model compiled with
// compile<options{.fullgraph = true}>: a build error ("graph break under fullgraph", graph_break.hpp)
// with "required from here" at the item() call. Without FUSEBOX_SHOULD_FAIL the model is compiled
// without fullgraph and builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

#ifdef FUSEBOX_SHOULD_FAIL
constexpr fb::options opts{.fullgraph = true};
#else
constexpr fb::options opts{};
#endif

auto model = [](auto x) { return x / fb::item(fb::max(fb::max(x, fb::axis<1>), fb::axis<0>)); };  // the misuse

void use(const fb::tensor<float, fb::shape<3, 4>>& x) {
  auto y = fb::compile<opts>(model)(x);
  (void)y;
}
