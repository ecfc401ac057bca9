// tests/optim/checkpoint.cpp: include/fusebox/optim/checkpoint.hpp. A run saved after three steps
// and resumed in a fresh optimizer (and fresh parameters loaded from their own file) must continue
// bit for bit as the uninterrupted run, for AdamW (with amsgrad, where the third moment matters)
// and SGD (momentum, whose first-step rule depends on the step count), AdamW without amsgrad (whose
// file holds only the two moments a step reads), with two parameter groups,
// a learning rate changed mid-run, and fresh random gradients each step. Every element of every
// parameter and state buffer is compared exactly. Loading into an optimizer that does not match
// the file is refused by name, and a refused load changes nothing.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <catch2/catch.hpp>

#include <fusebox/core/tensor.hpp>
#include <fusebox/io/safetensors.hpp>
#include <fusebox/optim/adamw.hpp>
#include <fusebox/optim/checkpoint.hpp>
#include <fusebox/optim/sgd.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using Catch::Matchers::Contains;

namespace {

struct model {
  fb::tensor<float, fb::shape<37, 19>> a;
  fb::tensor<float, fb::shape<19>> b;
  fb::tensor<float, fb::shape<3, 5501>> c;  // over a chunk: split across tasks
  explicit model(std::uint64_t seed) {
    fbt::fill_signed(a, seed + 1, 0.1, 1.0);
    fbt::fill_signed(b, seed + 2, 0.1, 1.0);
    fbt::fill_signed(c, seed + 3, 0.1, 1.0);
  }
  fb::nn::parameter_list<float> group(int g) {
    fb::nn::parameter_list<float> list;
    if (g == 0) {
      list.add("a", a);
      list.add("b", b);
    } else {
      list.add("c", c);
    }
    return list;
  }
  fb::nn::parameter_list<float> all() {
    auto list = group(0);
    list.append(group(1));
    return list;
  }
  auto grads(int step) const {
    std::tuple<fb::tensor<float, fb::shape<37, 19>>, fb::tensor<float, fb::shape<19>>, fb::tensor<float, fb::shape<3, 5501>>> g;
    const auto seed = 500 + 31 * static_cast<std::uint64_t>(step);
    fbt::fill_signed(std::get<0>(g), seed + 1, 0.01, 2.0);
    fbt::fill_signed(std::get<1>(g), seed + 2, 0.01, 2.0);
    fbt::fill_signed(std::get<2>(g), seed + 3, 0.01, 2.0);
    return g;
  }
};

struct temp_dir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("fusebox_checkpoint_test_" + std::to_string(::getpid()));
  temp_dir() { std::filesystem::create_directories(path); }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

template <class Opt>
using options_of = std::remove_cvref_t<decltype(std::declval<Opt&>().param_group(0).options)>;

template <class Opt>
Opt make(model& m, const options_of<Opt>& o1, const options_of<Opt>& o2) {
  Opt opt(m.group(0), o1);
  opt.add_param_group(m.group(1), o2);
  return opt;
}

/// Steps [from, to) with the gradients of those steps; the learning rate of every group halves
/// before step 2 (a schedule's change, which the file must carry).
template <class Opt>
void train(Opt& opt, const model& m, int from, int to) {
  for (int t = from; t < to; ++t) {
    if (t == 2) opt.set_lr(opt.lr(0) / 2);
    opt.step(m.grads(t));
  }
}

template <class Opt>
std::size_t differing(const model& x, const model& y, const Opt& ox, const Opt& oy) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < x.a.size(); ++i) n += x.a.flat(i) != y.a.flat(i);
  for (std::size_t i = 0; i < x.b.size(); ++i) n += x.b.flat(i) != y.b.flat(i);
  for (std::size_t i = 0; i < x.c.size(); ++i) n += x.c.flat(i) != y.c.flat(i);
  for (std::size_t p = 0; p < ox.parameter_count(); ++p)
    for (std::size_t k = 0; k < Opt::state_kinds; ++k)
      for (std::size_t i = 0; i < ox.parameter(p).size(); ++i) n += ox.state(k, p)[i] != oy.state(k, p)[i];
  return n;
}

template <class Opt, class Options>
void resume_matches_uninterrupted(const Options& o1, const Options& o2) {
  temp_dir dir;
  model straight(1);
  auto opt_straight = make<Opt>(straight, o1, o2);
  train(opt_straight, straight, 0, 6);

  model first(1);
  auto opt_first = make<Opt>(first, o1, o2);
  train(opt_first, first, 0, 3);
  fb::io::save_safetensors(dir.path / "model.safetensors", first.all());
  fb::optim::save_state(dir.path / "optimizer.safetensors", opt_first);

  model resumed(99);  // other initial values: everything must come from the files
  auto opt_resumed = make<Opt>(resumed, o1, o2);
  fb::io::load_safetensors(dir.path / "model.safetensors", resumed.all());
  fb::optim::load_state(dir.path / "optimizer.safetensors", opt_resumed);
  CHECK(opt_resumed.param_group(0).step == 3);
  CHECK(opt_resumed.param_group(1).step == 3);
  CHECK(opt_resumed.lr(0) == opt_first.lr(0));
  CHECK(opt_resumed.lr(1) == opt_first.lr(1));
  CHECK(opt_resumed.param_group(1).initial_lr == o2.lr);
  CHECK(differing(first, resumed, opt_first, opt_resumed) == 0);

  train(opt_resumed, resumed, 3, 6);
  CHECK(differing(straight, resumed, opt_straight, opt_resumed) == 0);
  CHECK(opt_resumed.param_group(0).step == 6);
}

}  // namespace

TEST_CASE("optim: AdamW (amsgrad) resumed from its saved state continues bit for bit") {
  resume_matches_uninterrupted<fb::optim::adamw<float>>(
      fb::optim::adamw_options{.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true},
      fb::optim::adamw_options{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.3, .amsgrad = true});
}

TEST_CASE("optim: AdamW without amsgrad saves the two moments a step reads, and resumes bit for bit") {
  resume_matches_uninterrupted<fb::optim::adamw<float>>(fb::optim::adamw_options{.lr = 1e-2, .weight_decay = 0.05},
                                                        fb::optim::adamw_options{.lr = 3e-3, .beta2 = 0.99});
}

TEST_CASE("optim: SGD with momentum resumed from its saved state continues bit for bit") {
  resume_matches_uninterrupted<fb::optim::sgd<float>>(
      fb::optim::sgd_options{.lr = 1e-2, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3},
      fb::optim::sgd_options{.lr = 5e-2, .momentum = 0.8, .nesterov = true});
}

TEST_CASE("optim: loading state that does not fit the optimizer is refused by name, and changes nothing") {
  temp_dir dir;
  model m(1);
  auto adam = make<fb::optim::adamw<float>>(m, {.lr = 1e-2}, {.lr = 1e-3});
  train(adam, m, 0, 2);
  const auto saved = dir.path / "adamw.safetensors";
  fb::optim::save_state(saved, adam);
  CHECK(fb::io::read_safetensors(saved).entries.size() == 3 * 2);  // exp_avg, exp_avg_sq: no amsgrad

  // Files and optimizers must agree on amsgrad (the third moment's tensors).
  model ams_model(3);
  auto ams = make<fb::optim::adamw<float>>(ams_model, {.lr = 1e-2, .amsgrad = true}, {.lr = 1e-3});
  CHECK_THROWS_WITH(fb::optim::load_state(saved, ams), Contains("missing 'state.0.max_exp_avg_sq'"));

  model other(2);
  auto sgd = make<fb::optim::sgd<float>>(other, {.lr = 1e-2, .momentum = 0.9}, {.lr = 1e-2});
  CHECK_THROWS_WITH(fb::optim::load_state(saved, sgd),
                    Contains("the optimizer is 'adamw' in the file but 'sgd' in this optimizer"));

  fb::optim::adamw<float> one_group(other.all(), {.lr = 1e-2});
  CHECK_THROWS_WITH(fb::optim::load_state(saved, one_group),
                    Contains("the number of parameter groups is 2 in the file but 1"));

  fb::tensor<float, fb::shape<37, 19>> x;
  fb::tensor<float, fb::shape<19>> y;
  fb::tensor<float, fb::shape<3, 5501>> z;
  fb::nn::parameter_list<float> renamed0, renamed1;
  renamed0.add("x", x);
  renamed0.add("y", y);
  renamed1.add("z", z);
  fb::optim::adamw<float> renamed(renamed0, {.lr = 1e-2});
  renamed.add_param_group(renamed1, {.lr = 1e-3});
  CHECK_THROWS_WITH(fb::optim::load_state(saved, renamed), Contains("parameter 0 is 'a' in the file but 'x'"));

  // Same names, another shape: the state tensor's shape is refused before anything is written.
  fb::tensor<float, fb::shape<19, 37>> a_t;
  fb::nn::parameter_list<float> reshaped0, reshaped1;
  reshaped0.add("a", a_t);
  reshaped0.add("b", y);
  reshaped1.add("c", z);
  fb::optim::adamw<float> reshaped(reshaped0, {.lr = 1e-2});
  reshaped.add_param_group(reshaped1, {.lr = 1e-3});
  CHECK_THROWS_WITH(fb::optim::load_state(saved, reshaped), Contains("tensor 'state.0.exp_avg'") && Contains("[37, 19]"));
  CHECK(reshaped.param_group(0).step == 0);
  CHECK(reshaped.state(0, 1)[0] == 0.0f);  // b's moment: untouched, though its tensor fitted

  // A parameter file is not an optimizer's state.
  fb::io::save_safetensors(dir.path / "params.safetensors", m.all());
  CHECK_THROWS_WITH(fb::optim::load_state(dir.path / "params.safetensors", adam),
                    Contains("no 'fusebox.optimizer' in its metadata"));
  CHECK_THROWS_WITH(fb::optim::load_state(dir.path / "missing.safetensors", adam), Contains("cannot be opened"));
}
