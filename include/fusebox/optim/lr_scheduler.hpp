// optim/lr_scheduler.hpp: learning-rate schedules as torch.optim.lr_scheduler has them, in closed
// form over the epoch counter (a schedule is a function of (initial lr, epoch), so it can be read
// ahead and never drifts by accumulated rounding):
//   step_lr{step_size, gamma}                       lr0 * gamma^floor(t / step_size)       (StepLR)
//   cosine_annealing_lr{t_max, eta_min}             eta_min + (lr0 - eta_min)(1 + cos(pi t / t_max)) / 2
//                                                   for t <= t_max (CosineAnnealingLR's closed form;
//                                                   torch's recursive update gives the same values up
//                                                   to rounding)
//   linear_lr{start_factor, end_factor, total_iters} lr0 * (start + (end - start) min(t, total) / total)
//                                                   (LinearLR: the usual linear warm-up)
//   sequential_lr{first, then, milestone}           first before the milestone, then `then` counted
//                                                   from it (SequentialLR of two schedules)
// scheduler<Optimizer, Schedule> applies one to every parameter group (from each group's initial
// lr): `step()` once per epoch (or per iteration, as the schedule is meant), like torch's.
// The optimizers take the learning rate as a run-time scalar of their fused pass, so a schedule
// never causes a recompile (nothing about the update is compiled per lr).
// Depends on: core/errors.hpp and the standard library.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <stdexcept>
#include <string>

#include "fusebox/core/errors.hpp"

namespace fusebox::optim {

struct step_lr {
  std::size_t step_size = 1;
  double gamma = 0.1;
  double operator()(double lr0, std::size_t t) const {
    if (step_size == 0) FUSEBOX_THROW(std::invalid_argument("fusebox::optim::step_lr: step_size must be at least 1"));
    return lr0 * std::pow(gamma, static_cast<double>(t / step_size));
  }
};

struct cosine_annealing_lr {
  std::size_t t_max = 1;
  double eta_min = 0;
  double operator()(double lr0, std::size_t t) const {
    if (t_max == 0) FUSEBOX_THROW(std::invalid_argument("fusebox::optim::cosine_annealing_lr: t_max must be at least 1"));
    return eta_min + (lr0 - eta_min) * (1 + std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(t_max))) / 2;
  }
};

struct linear_lr {
  double start_factor = 1.0 / 3;
  double end_factor = 1.0;
  std::size_t total_iters = 5;
  double operator()(double lr0, std::size_t t) const {
    if (!(start_factor > 0 && start_factor <= 1) || !(end_factor >= 0 && end_factor <= 1))
      FUSEBOX_THROW(std::invalid_argument("fusebox::optim::linear_lr: start_factor must be in (0, 1] and end_factor in [0, 1]"));
    if (total_iters == 0) return lr0 * end_factor;
    const double f = static_cast<double>(t < total_iters ? t : total_iters) / static_cast<double>(total_iters);
    return lr0 * (start_factor + (end_factor - start_factor) * f);
  }
};

template <class First, class Then>
struct sequential_lr {
  First first;
  Then then;
  std::size_t milestone = 0;
  double operator()(double lr0, std::size_t t) const { return t < milestone ? first(lr0, t) : then(lr0, t - milestone); }
};
template <class First, class Then>
sequential_lr(First, Then, std::size_t) -> sequential_lr<First, Then>;

/// Sets every group's lr of `opt` from the schedule: at construction (epoch 0) and at each step().
template <class Optimizer, class Schedule>
class scheduler {
 public:
  scheduler(Optimizer& opt, Schedule s) : opt_(opt), s_(s) { apply(); }
  void step() {
    ++epoch_;
    apply();
  }
  std::size_t epoch() const noexcept { return epoch_; }
  /// The lr of group g now (torch's get_last_lr()[g]).
  double last_lr(std::size_t g = 0) const { return opt_.param_group(g).options.lr; }

 private:
  void apply() {
    for (std::size_t g = 0; g < opt_.group_count(); ++g) {
      auto& group = opt_.param_group(g);
      group.options.lr = s_(group.initial_lr, epoch_);
    }
  }
  Optimizer& opt_;
  Schedule s_;
  std::size_t epoch_ = 0;
};

}  // namespace fusebox::optim
