// tests/nn/embedding.cpp: embedding(weight, ids) (ops/embedding.hpp, backend/cpu/gather.hpp) and
// nn::embedding (nn/embedding.hpp). The forward against a naive double gather on random weights
// and random ids with repeats (eager, compiled on the static path, compiled on the run-time path
// with a dyn batch, strided ids); the weight's gradient against central differences (eager and
// compiled, tests/autodiff/check_grad.hpp) and against a naive scatter-add in double; the scatter-add
// the same bit for bit on 1 and 2 threads; out-of-range ids refused with the op, the id, V and the
// caller's line; the module's names, init, training steps (compiled == eager) and safetensors.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../autodiff/check_grad.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {

/// Ids in [0, v) from a seed, as numbers of type T; ids[1] repeats ids[0] and ids[2] repeats ids[0]
/// again, so a row is gathered (and its gradient summed) three times at least.
template <class T, class S>
fb::tensor<T, S> random_ids(std::uint64_t seed, std::size_t v, std::size_t n = S::size) {
  auto ids = [&] {
    if constexpr (S::is_static) return fb::tensor<T, S>();
    else return fb::tensor<T, S>(fb::dims{S::rank, {n / S::extents[S::rank - 1], S::extents[S::rank - 1]}});
  }();
  fb::detail::splitmix64 g{seed};
  for (std::size_t i = 0; i < ids.size(); ++i) ids.flat(i) = static_cast<T>(g.next() % v);
  ids.flat(1) = ids.flat(0);
  ids.flat(2) = ids.flat(0);
  return ids;
}

/// out[i, :] = w[ids[i], :] in double, ids in row-major order.
template <class W, class I>
std::vector<double> gather_reference(const W& w, const I& ids) {
  const std::size_t d = w.extent(1);
  std::vector<double> out(ids.size() * d);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t e = 0; e < d; ++e) out[i * d + e] = static_cast<double>(w(static_cast<std::size_t>(ids.flat(i)), e));
  return out;
}

template <class Y>
void check_gather(const char* what, const Y& y, const std::vector<double>& ref) {
  REQUIRE(y.size() == ref.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) bad += static_cast<double>(y.flat(i)) != ref[i];
  INFO(what << ": " << bad << " of " << ref.size() << " elements differ from the double gather");
  CHECK(bad == 0);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const fb::error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains_all(const std::string& s, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (s.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace

TEST_CASE("embedding: the forward equals a double gather (eager, compiled static, run-time path, strided ids)") {
  using w_t = fb::tensor<float, fb::shape<50, 13>>;
  w_t w;
  fbt::fill_signed(w, 7, 0.1, 2.0);
  const auto ids = random_ids<float, fb::shape<4, 7>>(11, 50);
  const auto ref = gather_reference(w, ids);

  const auto eager = fb::embedding(w, ids);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(eager)>, fb::tensor<float, fb::shape<4, 7, 13>>>);
  check_gather("eager", eager, ref);

  auto model = [](const auto& w, const auto& ids) { return fb::embedding(w, ids); };
  check_gather("compiled", fb::compile(model)(w, ids), ref);
  // Fused with what follows: the gather is its own kernel, its consumers read it from the arena.
  auto scaled = fb::compile([](const auto& w, const auto& ids) { return fb::embedding(w, ids) * 2.0f + 1.0f; })(w, ids);
  std::vector<double> ref2(ref);
  for (double& v : ref2) v = static_cast<double>(static_cast<float>(v) * 2.0f + 1.0f);
  check_gather("compiled, with an elementwise consumer", scaled, ref2);

  // ids of rank 1 and a transposed (strided) view of the ids.
  const auto ids1 = random_ids<float, fb::shape<9>>(12, 50);
  check_gather("rank-1 ids", fb::compile(model)(w, ids1), gather_reference(w, ids1));
  auto transposed = fb::compile([](const auto& w, const auto& ids) { return fb::embedding(w, fb::transpose(ids)); });
  const auto yt = transposed(w, ids);
  REQUIRE(yt.extents() == fb::dims{3, {7, 4, 13}});
  std::size_t bad = 0;
  for (std::size_t i = 0; i < 7; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      for (std::size_t e = 0; e < 13; ++e) bad += yt(i, j, e) != w(static_cast<std::size_t>(ids(j, i)), e);
  CHECK(bad == 0);

  // Double weights, and the run-time path: a batch known only at the call.
  fb::tensor<double, fb::shape<50, 13>> wd;
  fbt::fill_signed(wd, 8, 0.1, 2.0);
  const auto idd = random_ids<double, fb::shape<fb::dyn, 5>>(13, 50, 15);
  check_gather("eager, dyn batch", fb::embedding(wd, idd), gather_reference(wd, idd));
  auto dyn = fb::compile([](const auto& w, const auto& ids) { return fb::embedding(w, ids) + 0.5; });
  const auto yd = dyn(wd, idd);
  REQUIRE(yd.extents() == fb::dims{3, {3, 5, 13}});
  auto refd = gather_reference(wd, idd);
  for (double& v : refd) v += 0.5;
  check_gather("run-time path (dyn batch)", yd, refd);
  const auto idd2 = random_ids<double, fb::shape<fb::dyn, 5>>(14, 50, 35);  // another batch: the symbolic program
  auto refd2 = gather_reference(wd, idd2);
  for (double& v : refd2) v += 0.5;
  check_gather("run-time path, second batch", dyn(wd, idd2), refd2);
}

TEST_CASE("embedding: the weight's gradient matches central differences and a naive scatter-add") {
  // Repeated ids: rows gathered several times get the sum of their rows' gradients.
  const auto w = fbt::signed_tensor<fb::shape<9, 6>>(21);
  const auto ids = random_ids<double, fb::shape<3, 5>>(22, 9);
  const auto t = fbt::signed_tensor<fb::shape<3, 5, 6>>(23);
  auto loss = [](const auto& w, const auto& ids, const auto& t) {
    const auto e = fb::embedding(w, ids) - t;
    return fb::mean(fb::mean(fb::mean(e * e * e)));  // a gradient that differs per element
  };
  fbt::check_grad("embedding, cubic loss", loss, fb::wrt<0>, w, ids, t);

  // Naive scatter-add of d loss / d out = 3 e^2 / n in double.
  std::vector<double> ref(9 * 6, 0.0);
  for (std::size_t i = 0; i < 15; ++i)
    for (std::size_t c = 0; c < 6; ++c) {
      const auto v = static_cast<std::size_t>(ids.flat(i));
      const double e = w(v, c) - t.flat(i * 6 + c);
      ref[v * 6 + c] += 3 * e * e / 90.0;
    }
  const auto dw = fb::compile(fb::grad(loss, fb::wrt<0>))(w, ids, t);
  const auto dw_eager = fb::grad(loss, fb::wrt<0>)(w, ids, t);
  std::size_t bad = 0, zero_rows = 0;
  for (std::size_t k = 0; k < ref.size(); ++k) {
    bad += !(std::fabs(dw.flat(k) - ref[k]) <= 1e-14 * (1 + std::fabs(ref[k])));
    bad += !(std::fabs(dw_eager.flat(k) - ref[k]) <= 1e-14 * (1 + std::fabs(ref[k])));
  }
  for (std::size_t v = 0; v < 9; ++v) zero_rows += ref[v * 6] == 0.0;
  INFO(bad << " gradient elements differ from the naive scatter-add");
  CHECK(bad == 0);
  CHECK(zero_rows >= 1);  // rows no id names: their gradient must be (and is checked) zero

  // Two embeddings (GPT-2's wte + wpe) in one loss: each table gets its own gradient.
  const auto wpe = fbt::signed_tensor<fb::shape<5, 6>>(24);
  fb::tensor<double, fb::shape<5>> pos;
  for (std::size_t i = 0; i < 5; ++i) pos.flat(i) = static_cast<double>(4 - i);
  auto two = [](const auto& wte, const auto& wpe, const auto& ids, const auto& pos, const auto& t) {
    const auto h = fb::embedding(wte, ids) + fb::embedding(wpe, pos) - t;
    return fb::mean(fb::mean(fb::mean(h * h)));
  };
  fbt::check_grad("wte + wpe", two, fb::wrt<0, 1>, w, wpe, ids, pos, t);
}

TEST_CASE("embedding: the scatter-add is the same bit for bit on 1 and 2 threads") {
  // Float, many repeats of few rows (each row sums ~40 rows of g): a different summation order
  // would show in the last bits.
  fb::tensor<float, fb::shape<64, 40>> w;
  fbt::fill_signed(w, 31, 0.1, 2.0);
  const auto ids = random_ids<float, fb::shape<32, 80>>(32, 64);
  fb::tensor<float, fb::shape<32, 80, 40>> t;
  fbt::fill_signed(t, 33, 0.1, 2.0);
  auto loss = [](const auto& w, const auto& ids, const auto& t) {
    return fb::sum(fb::sum(fb::sum(fb::embedding(w, ids) * t)));
  };
  const auto one = fb::compile(fb::grad(loss, fb::wrt<0>), {.threads = 1})(w, ids, t);
  const auto two = fb::compile(fb::grad(loss, fb::wrt<0>), {.threads = 2})(w, ids, t);
  std::size_t differ = 0;
  for (std::size_t k = 0; k < one.size(); ++k) differ += std::memcmp(&one.flat(k), &two.flat(k), sizeof(float)) != 0;
  CHECK(differ == 0);
  // And the sum is t's rows summed in increasing position (the documented order), in float.
  std::vector<float> ref(64 * 40, 0.0f);
  for (std::size_t i = 0; i < 32 * 80; ++i)
    for (std::size_t c = 0; c < 40; ++c) ref[static_cast<std::size_t>(ids.flat(i)) * 40 + c] += t.flat(i * 40 + c);
  std::size_t bad = 0;
  for (std::size_t k = 0; k < ref.size(); ++k) bad += one.flat(k) != ref[k];
  CHECK(bad == 0);
}

TEST_CASE("embedding: ids out of range are refused with the op, the id, V and the caller's line") {
  fb::tensor<float, fb::shape<10, 4>> w;
  fbt::fill_signed(w, 41, 0.1, 2.0);
  fb::tensor<float, fb::shape<2, 3>> ids;
  ids.assign({0, 1, 2, 3, 4, 5});
  auto model = [](const auto& w, const auto& ids) { return fb::embedding(w, ids); };
  auto compiled = fb::compile(model);
  auto loss = [](const auto& w, const auto& ids) { return fb::sum(fb::sum(fb::sum(fb::embedding(w, ids)))); };
  auto compiled_grad = fb::compile(fb::grad(loss, fb::wrt<0>));
  for (const float bad : {10.0f, -1.0f, 2.5f, NAN}) {
    ids.flat(4) = bad;
    char id[32];
    std::snprintf(id, sizeof id, "id %.17g ", static_cast<double>(bad));
    for (const std::string& what : {error_of([&] { (void)fb::embedding(w, ids); }),
                                    error_of([&] { (void)compiled(w, ids); }),
                                    error_of([&] { (void)compiled_grad(w, ids); }),
                                    error_of([&] { (void)fb::grad(loss, fb::wrt<0>)(w, ids); })}) {
      INFO(what);
      CHECK(contains_all(what, {"embedding(weight, ids)", id, "element 4 of ids [2, 3]", "V = 10", "embedding.cpp:"}));
    }
  }
  // The run-time path, and ids computed inside the model (checked by the kernel: no line there).
  fb::tensor<float, fb::shape<fb::dyn, 3>> dids(fb::dims{2, {1, 3}});
  dids.assign({1, 10, 2});
  CHECK(contains_all(error_of([&] { (void)compiled(w, dids); }), {"id 10 ", "V = 10", "embedding.cpp:"}));
  ids.assign({0, 1, 2, 3, 4, 5});
  auto shifted = fb::compile([](const auto& w, const auto& ids) { return fb::embedding(w, ids + 5.0f); });
  const std::string inside = error_of([&] { (void)shifted(w, ids); });
  INFO(inside);
  CHECK(contains_all(inside, {"embedding(weight, ids): id 10 ", "element 5 of ids [2, 3]", "V = 10"}));
}

TEST_CASE("nn::embedding: torch's names and init; compiled training steps follow the eager ones; safetensors") {
  using model_t = nn::sequential<nn::embedding<12, 6, double>, nn::linear<6, 4, double>>;
  model_t a(3), b(3);
  auto pa = a.parameters<double>(), pb = b.parameters<double>();
  REQUIRE(pa.size() == 3);
  CHECK(pa[0].name == "0.weight");
  CHECK(pa[0].shape == fb::dims{2, {12, 6}});

  // normal(0, 1): mean and standard deviation of a large table.
  nn::embedding<1000, 64> big(nn::seeded{5});
  double s = 0, s2 = 0;
  for (std::size_t i = 0; i < big.weight.size(); ++i) {
    s += big.weight.flat(i);
    s2 += static_cast<double>(big.weight.flat(i)) * big.weight.flat(i);
  }
  const double mean = s / 64000, sd = std::sqrt(s2 / 64000 - mean * mean);
  INFO("init mean " << mean << ", sd " << sd);
  CHECK(std::fabs(mean) < 0.02);  // 5 standard errors (1 / sqrt(64000) = 0.004)
  CHECK(std::fabs(sd - 1) < 0.02);
  CHECK(big.parameters()[0].name == "weight");

  fb::optim::adamw oa(pa, {.lr = 1e-2, .weight_decay = 0.1}), ob(pb, {.lr = 1e-2, .weight_decay = 0.1});
  auto compiled = nn::compile_step(a, nn::cross_entropy_loss{});
  auto eager = nn::eager_step(b, nn::cross_entropy_loss{});
  double first = 0, last = 0;
  const auto x = random_ids<double, fb::shape<8>>(60, 12);  // one batch: the loss must go down
  for (int step = 0; step < 5; ++step) {
    int labels[8];
    for (std::size_t i = 0; i < 8; ++i) labels[i] = static_cast<int>(x.flat(i)) % 4;  // learnable
    const auto t = nn::one_hot<4, 8, double>(std::span<const int>(labels));
    auto [la, ga] = compiled(x, t);
    auto [lb, gb] = eager(x, t);
    CHECK(std::fabs(la.flat(0) - lb.flat(0)) <= 1e-12);
    oa.step(ga);
    ob.step(gb);
    if (step == 0) first = la.flat(0);
    last = la.flat(0);
  }
  for (std::size_t i = 0; i < pa.size(); ++i) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < pa[i].size(); ++k)
      bad += !(std::fabs(pa[i].data[k] - pb[i].data[k]) <= 1e-12 * (1 + std::fabs(pb[i].data[k])));
    INFO(pa[i].name << ": " << bad << " elements differ between compiled and eager training");
    CHECK(bad == 0);
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < first);

  const auto path = std::filesystem::temp_directory_path() / ("fusebox_embedding_" + std::to_string(::getpid()) + ".safetensors");
  fb::io::save_safetensors(path, pa);
  model_t c(99);
  fb::io::load_safetensors(path, c.parameters<double>());
  std::filesystem::remove(path);
  std::size_t differ = 0;
  for (std::size_t k = 0; k < a.layer<0>().weight.size(); ++k) differ += c.layer<0>().weight.flat(k) != a.layer<0>().weight.flat(k);
  CHECK(differ == 0);
}
