// Compile-fail: fb::grad(loss, fb::wrt<1>) where argument 1 is the ids of embedding(w, ids): ids
// are indices and have no gradient (as in torch), and the build error says so by name
// (ops/embedding.hpp: autodiff::detail::embedding_vjp). Without FUSEBOX_SHOULD_FAIL the gradient
// is taken with respect to the weight (argument 0) and it builds.
#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

auto loss = [](const auto& w, const auto& ids) { return fb::sum(fb::sum(fb::embedding(w, ids))); };

#ifdef FUSEBOX_SHOULD_FAIL
inline constexpr auto which = fb::wrt<1>;  // the misuse: the ids
#else
inline constexpr auto which = fb::wrt<0>;
#endif

void use(const fb::tensor<float, fb::shape<10, 4>>& w, const fb::tensor<float, fb::shape<3>>& ids) {
  auto g = fb::compile(fb::grad(loss, which))(w, ids);
  (void)g;
}
