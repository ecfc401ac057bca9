// optim/checkpoint.hpp: an optimizer's state to and from a file, so training can stop and resume
// where it was (torch's optimizer.state_dict() / load_state_dict(), saved beside the model's
// parameters: io/safetensors.hpp).
//
//   io::save_safetensors("model.safetensors", model.parameters());
//   optim::save_state("optimizer.safetensors", opt);
//   ... a later process, same model and optimizer built the same way:
//   io::load_safetensors("model.safetensors", model.parameters());
//   optim::load_state("optimizer.safetensors", opt);   // the next step is the step that would have come
//
// The file is safetensors: one tensor per parameter and kind of state a step reads (AdamW's
// max_exp_avg_sq only with amsgrad, SGD's momentum_buffer only with momentum), named
// "state.<parameter index>.<state name>" (torch keys its state by parameter index too), e.g.
// "state.3.exp_avg_sq"; metadata: the optimizer's name, the number of groups and parameters, each
// parameter's name, and per group its step count, learning rate and initial learning rate (what
// schedules scale), the numbers torch's state_dict keeps with each param group. Other
// hyperparameters are the code's: the optimizer is built with them before loading, as in torch.
//
// Loading checks everything before it changes anything: the optimizer's name, the group and
// parameter counts, each parameter's name and shape, and every state tensor (no missing or extra
// ones); each mismatch is a fusebox::invalid_argument naming the file, what the file holds and
// what the optimizer holds. The step counts matter: AdamW's bias corrections and SGD's first-step
// momentum rule depend on them, so a resumed run updates bit for bit as the uninterrupted one.
//
// Depends on: io/safetensors.hpp, optim/multi_tensor.hpp.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/io/safetensors.hpp"
#include "fusebox/optim/multi_tensor.hpp"

namespace fusebox::optim {

namespace detail {

/// The optimizer's live state buffers as a parameter list named "state.<i>.<state name>".
template <class Optimizer, class T = typename Optimizer::value_type>
nn::parameter_list<T> state_list(const Optimizer& opt) {
  nn::parameter_list<T> list;
  for (std::size_t i = 0; i < opt.parameter_count(); ++i)
    for (std::size_t k = 0; k < opt.live_state_kinds(); ++k)
      list.add("state." + std::to_string(i) + "." + Optimizer::state_names[k], const_cast<T*>(opt.state(k, i)),
               opt.parameter(i).shape);
  return list;
}

inline std::string exact_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips through strtod
  return buf;
}

}  // namespace detail

/// Writes `opt`'s state to `path` (replaced atomically: written beside it, then renamed).
template <class Optimizer>
void save_state(const std::filesystem::path& path, const Optimizer& opt) {
  std::vector<std::pair<std::string, std::string>> meta = {
      {"fusebox.optimizer", opt.name()},
      {"groups", std::to_string(opt.group_count())},
      {"parameters", std::to_string(opt.parameter_count())}};
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    const auto& group = opt.param_group(g);
    const std::string at = "group." + std::to_string(g) + ".";
    meta.emplace_back(at + "step", std::to_string(group.step));
    meta.emplace_back(at + "lr", detail::exact_text(group.options.lr));
    meta.emplace_back(at + "initial_lr", detail::exact_text(group.initial_lr));
  }
  for (std::size_t i = 0; i < opt.parameter_count(); ++i)
    meta.emplace_back("parameter." + std::to_string(i), opt.parameter(i).name);
  io::save_safetensors(path, detail::state_list(opt), meta);
}

/// Reads the state `save_state` wrote into `opt`, built with the same parameters and groups.
template <class Optimizer>
void load_state(const std::filesystem::path& path, Optimizer& opt,
                std::source_location loc = std::source_location::current()) {
  const std::string file = "fusebox::optim::load_state: '" + path.string() + "'";
  const io::safetensors_file f = io::read_safetensors(path);
  auto meta = [&](const std::string& key) -> const std::string& {
    for (const auto& [k, v] : f.metadata)
      if (k == key) return v;
    FUSEBOX_THROW(invalid_argument(file + ": no '" + key + "' in its metadata (not written by optim::save_state?) (at " +
                                   where(loc) + ")"));
  };
  auto number = [&](const std::string& key) {
    const std::string& text = meta(key);
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size())
      FUSEBOX_THROW(invalid_argument(file + ": metadata '" + key + "' is '" + text + "', not a count (at " + where(loc) + ")"));
    return v;
  };
  auto real = [&](const std::string& key) {
    const std::string& text = meta(key);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0')
      FUSEBOX_THROW(invalid_argument(file + ": metadata '" + key + "' is '" + text + "', not a number (at " + where(loc) + ")"));
    return v;
  };
  auto mismatch = [&](const std::string& what, const std::string& in_file, const std::string& here) {
    FUSEBOX_THROW(invalid_argument(file + ": " + what + " is " + in_file + " in the file but " + here +
                                   " in this optimizer (at " + where(loc) + ")"));
  };

  if (meta("fusebox.optimizer") != opt.name())
    mismatch("the optimizer", "'" + meta("fusebox.optimizer") + "'", std::string("'") + opt.name() + "'");
  if (number("groups") != opt.group_count())
    mismatch("the number of parameter groups", meta("groups"), std::to_string(opt.group_count()));
  if (number("parameters") != opt.parameter_count())
    mismatch("the number of parameters", meta("parameters"), std::to_string(opt.parameter_count()));
  for (std::size_t i = 0; i < opt.parameter_count(); ++i) {
    const std::string& saved = meta("parameter." + std::to_string(i));
    if (saved != opt.parameter(i).name) mismatch("parameter " + std::to_string(i), "'" + saved + "'", "'" + opt.parameter(i).name + "'");
  }
  struct group_state {
    std::uint64_t step;
    double lr, initial_lr;
  };
  std::vector<group_state> groups;
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    const std::string at = "group." + std::to_string(g) + ".";
    groups.push_back({number(at + "step"), real(at + "lr"), real(at + "initial_lr")});
  }
  // Shapes, dtypes and the exact set of state tensors are checked here, before anything is written.
  io::load_safetensors(f, file, detail::state_list(opt), /*strict=*/true, loc);
  for (std::size_t g = 0; g < opt.group_count(); ++g) {
    auto& group = opt.param_group(g);
    group.step = groups[g].step;
    group.options.lr = groups[g].lr;
    group.initial_lr = groups[g].initial_lr;
  }
}

}  // namespace fusebox::optim
