// tests/autodiff/memory_budget.hpp: checks shared by the activation-memory-budget tests
// (autodiff/memory_budget.cpp, nn/gpt2.cpp): the measured peak of a call, gradients equal to
// budget 1's element by element, central differences of a compiled loss.
// Depends on: fusebox, Catch2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

namespace fbt {

/// Bytes the first call of a fresh compiled function holds at its peak beyond what was live
/// before (arena, workspace, outputs), by fusebox's byte counters.
template <class C, class... Args>
std::size_t measured_peak(C& c, const Args&... args) {
  fusebox::memory().reset_peak();
  const std::size_t before = fusebox::memory().live.load();
  { auto out = c(args...); }
  return fusebox::memory().peak.load() - before;
}

/// Every element of a and b: equal to 1e-13 of the largest; returns how many differ at all.
template <class A, class B>
std::size_t check_equal(const std::string& what, const A& a, const B& b) {
  double largest = 0;
  for (std::size_t i = 0; i < b.size(); ++i) largest = std::max(largest, std::fabs(b.flat(i)));
  std::size_t bad = 0, differ = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    differ += a.flat(i) != b.flat(i);
    bad += !(std::fabs(a.flat(i) - b.flat(i)) <= 1e-13 * (1 + largest));
  }
  INFO(what << ": " << bad << " of " << b.size() << " elements differ from budget 1's beyond rounding");
  CHECK(bad == 0);
  return differ;
}

/// Central differences of the compiled loss `c` (value_and_grad) at every element of argument K
/// against its gradient g.
template <std::size_t K, class C, class Tuple, class G>
void check_fd(const std::string& what, C& c, Tuple args, const G& g) {
  auto& a = std::get<K>(args);
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x0 = a.flat(i), h = 1e-6 * std::max(1.0, std::fabs(x0));
    a.flat(i) = x0 + h;
    const double up = std::apply([&](const auto&... v) { return c(v...).first.flat(0); }, args);
    a.flat(i) = x0 - h;
    const double down = std::apply([&](const auto&... v) { return c(v...).first.flat(0); }, args);
    a.flat(i) = x0;
    const double fd = (up - down) / (2 * h), an = g.flat(i);
    if (!(std::fabs(fd - an) <= 1e-7 + 1e-7 * std::fabs(fd))) {
      if (bad++ == 0) first = "element " + std::to_string(i) + ": gradient " + std::to_string(an) + ", differences " +
                              std::to_string(fd);
    }
  }
  INFO(what << ", argument " << K << ": " << bad << " of " << a.size() << " elements off; first " << first);
  CHECK(bad == 0);
}

}  // namespace fbt
