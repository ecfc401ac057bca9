// tests/optim/clip_grad.cpp: include/fusebox/optim/clip_grad.hpp against a double reference of
// torch.nn.utils.clip_grad_norm_ (written out here), on fresh random gradients of odd sizes (one
// over a chunk), for the 2-norm, the 1-norm, a fractional p and the max norm; every element
// checked. The result does not depend on the thread count; a NaN norm under error_if_nonfinite is
// an error that scales nothing; bad arguments are refused by name.
#include <cmath>
#include <cstddef>
#include <limits>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/core/tensor.hpp>
#include <fusebox/optim/clip_grad.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using Catch::Matchers::Contains;

namespace {

using grads_t = std::tuple<fb::tensor<float, fb::shape<37, 19>>, fb::tensor<float, fb::shape<19>>,
                           fb::tensor<float, fb::shape<3, 5501>>>;

grads_t random_grads(std::uint64_t seed) {
  grads_t g;
  fbt::fill_signed(std::get<0>(g), seed + 1, 0.01, 2.0);
  fbt::fill_signed(std::get<1>(g), seed + 2, 0.01, 2.0);
  fbt::fill_signed(std::get<2>(g), seed + 3, 0.01, 2.0);
  return g;
}

std::vector<double> flat(const grads_t& g) {
  std::vector<double> v;
  std::apply([&](const auto&... t) { ((
      [&] { for (std::size_t i = 0; i < t.size(); ++i) v.push_back(t.flat(i)); }()), ...); }, g);
  return v;
}

double reference_norm(const std::vector<double>& v, double p) {
  double acc = 0;
  for (double x : v) acc = std::isinf(p) ? std::max(acc, std::abs(x)) : acc + std::pow(std::abs(x), p);
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}

}  // namespace

TEST_CASE("optim: clip_grad_norm matches torch's formula in double, every element") {
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {2.0, 1.0, 1.5, inf}) {
    for (double fraction : {0.25, 2.0}) {  // clipped, and left alone
      grads_t g = random_grads(static_cast<std::uint64_t>(p * 10 + fraction * 100));
      const auto before = flat(g);
      const double ref = reference_norm(before, p);
      const double max_norm = fraction * ref;
      const double total = fb::optim::clip_grad_norm(g, max_norm, {.norm_type = p});
      INFO("p = " << p << ", max_norm = " << max_norm);
      CHECK(std::abs(total - ref) <= 1e-12 * ref);
      const double coef = std::min(1.0, max_norm / (ref + 1e-6));
      const auto after = flat(g);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < after.size(); ++i)
        wrong += std::abs(after[i] - before[i] * coef) > 2e-7 * std::abs(before[i] * coef);
      CHECK(wrong == 0);
      if (fraction > 1) CHECK(after == before);  // not clipped: untouched, bit for bit
      else CHECK(reference_norm(after, p) == Approx(max_norm).epsilon(1e-5));
    }
  }
}

TEST_CASE("optim: clip_grad_norm of one tensor; the norm does not depend on the thread count") {
  grads_t a = random_grads(7), b = random_grads(7);
  const double one = fb::optim::clip_grad_norm(a, 0.5, {.threads = 1});
  const double two = fb::optim::clip_grad_norm(b, 0.5, {.threads = 2});
  CHECK(one == two);
  CHECK(flat(a) == flat(b));

  fb::tensor<float, fb::shape<19>> single;
  fbt::fill_signed(single, 3, 0.5, 1.5);
  const auto before = single.flat(0);
  const double n = fb::optim::clip_grad_norm(single, 1.0);
  CHECK(n > 1.0);
  CHECK(single.flat(0) == Approx(before / (n + 1e-6)).epsilon(1e-6));
}

TEST_CASE("optim: clip_grad_norm refuses bad arguments and, with error_if_nonfinite, a NaN norm") {
  grads_t g = random_grads(9);
  std::get<1>(g).flat(4) = std::numeric_limits<float>::quiet_NaN();
  const auto before = flat(g);
  CHECK_THROWS_WITH(fb::optim::clip_grad_norm(g, 1.0, {.error_if_nonfinite = true}),
                    Contains("the total 2.000000-norm of the gradients is") && Contains("nan"));
  const auto after = flat(g);
  for (std::size_t i = 0; i < after.size(); ++i)
    if (!std::isnan(before[i])) REQUIRE(after[i] == before[i]);  // nothing scaled
  // Without the flag the NaN reaches every gradient, as torch's does.
  CHECK(std::isnan(fb::optim::clip_grad_norm(g, 1.0)));
  CHECK(std::isnan(std::get<0>(g).flat(0)));

  grads_t h = random_grads(10);
  CHECK_THROWS_WITH(fb::optim::clip_grad_norm(h, -1.0), Contains("max_norm >= 0 (got -1.000000)"));
  CHECK_THROWS_WITH(fb::optim::clip_grad_norm(h, 1.0, {.norm_type = 0}), Contains("need norm_type > 0"));
}
