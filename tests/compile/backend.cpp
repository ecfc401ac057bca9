// tests/compile/backend.cpp: options::backend (include/fusebox/options.hpp, compile.hpp).
//   automatic (the default): run where the arguments are, as before the option was read.
//   cpu: host tensors run on the CPU; cuda::tensor arguments are an error naming the fix.
//   cuda: host tensors run on the GPU (upload, run, download) when the backend is given at build
//         time; without a usable GPU every form throws backend_unavailable saying what was tried and
//         the fix, never a silent CPU run.
// The cases tagged [cuda] need a GPU and say "skipped" without one.
#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gelu_sigmoid.hpp"

namespace fb = fusebox;

namespace {

const auto model = fbt::gelu_sigmoid;
const auto reference = fbt::gelu_sigmoid_ref;

struct inputs {
  fb::tensor<float, fb::shape<16, 32>> x;
  fb::tensor<float, fb::shape<32>> w, b;
  inputs() {
    x.fill_random(1, -2.0f, 2.0f);
    w.fill_random(2, 0.5f, 1.5f);
    b.fill_random(3, -1.0f, 1.0f);
  }
  void check(const fb::tensor<float, fb::shape<16, 32>>& y, double tol = 1e-5) const {
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("element " << i);
      REQUIRE(y.flat(i) == Approx(reference(x.flat(i), w.flat(i % 32), b.flat(i % 32))).epsilon(tol).margin(1e-6));
    }
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("backend: the default follows the arguments (host tensors: CPU)", "[compile][backend]") {
  STATIC_REQUIRE(fb::options{}.backend == fb::backend::automatic);
  const inputs in;
  in.check(fb::compile(model)(in.x, in.w, in.b));
  in.check(fb::compile(model, {.backend = fb::backend::cpu})(in.x, in.w, in.b));
}

TEST_CASE("backend::cuda without a GPU throws backend_unavailable: what was tried and the fix", "[compile][backend]") {
  if (fb::cuda::available()) {
    WARN("a CUDA device is present: this case is for machines without one (skipped)");
    return;
  }
  const inputs in;
  auto expect_unavailable = [&](auto&& call) {
    try {
      call();
      FAIL("backend::cuda ran on a machine without a usable GPU");
    } catch (const fb::backend_unavailable& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(contains(what, "the CUDA backend is unavailable"));
      CHECK(contains(what, "options{.backend = backend::cuda}"));
      CHECK(contains(what, "host tensors [16, 32], [32], [32]"));
      CHECK(contains(what, "tried"));                  // what was tried (the driver library's names)
      CHECK(contains(what, "libcuda"));
      CHECK(contains(what, "To fix"));                  // the driver's fix
      CHECK(contains(what, "backend::automatic"));      // and ours: run on the CPU
    }
  };
  SECTION("given at build time") {
    auto f = fb::compile<fb::options{.backend = fb::backend::cuda}>(model);
    expect_unavailable([&] { (void)f(in.x, in.w, in.b); });
  }
  SECTION("given at run time") {
    auto f = fb::compile(model, {.backend = fb::backend::cuda});
    expect_unavailable([&] { (void)f(in.x, in.w, in.b); });
    fb::tensor<float, fb::shape<16, 32>> out;
    CHECK_THROWS_WITH(f.run(out, in.x, in.w, in.b), Catch::Contains("compiled::run") &&
                                                        Catch::Contains("backend::cuda"));
  }
  SECTION("rolled back, the model runs eagerly on the host, as every rolled-back function does") {
    auto f = fb::compile(model, {.backend = fb::backend::cuda});
    f.disable();
    in.check(f(in.x, in.w, in.b));
  }
}

TEST_CASE("backend::cuda with host tensors runs on the GPU and matches", "[compile][backend][cuda]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  const inputs in;
  auto f = fb::compile<fb::options{.backend = fb::backend::cuda}>(model);
  const auto before = fb::jit::counters().compiles.load();
  in.check(f(in.x, in.w, in.b), 1e-4);  // a host tensor back
  CHECK(fb::jit::counters().compiles.load() > before);  // NVRTC built it: it ran on the GPU
  auto g = fb::compile(model, {.backend = fb::backend::cuda});
  CHECK_THROWS_WITH(g(in.x, in.w, in.b), Catch::Contains("give the backend at build time"));
}

TEST_CASE("backend::cpu refuses cuda::tensor arguments by name", "[compile][backend][cuda]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped");
    return;
  }
  const inputs in;
  const fb::cuda::tensor<float, fb::shape<16, 32>> x(in.x);
  const fb::cuda::tensor<float, fb::shape<32>> w(in.w), b(in.b);
  auto f = fb::compile(model, {.backend = fb::backend::cpu});
  CHECK_THROWS_AS(f(x, w, b), fb::invalid_argument);
  CHECK_THROWS_WITH(f(x, w, b), Catch::Contains("backend::cpu") && Catch::Contains("cuda::tensor arguments [16, 32]") &&
                                    Catch::Contains("to_host()"));
  in.check(fb::compile(model)(x, w, b).to_host(), 1e-4);  // automatic: on the GPU
}
