// runtime/guard.hpp: guards and the recompilation policy of the run-time path.
//
// A specialisation is valid for the calls its guard accepts. The guard covers, per tensor
// argument: each extent (a fixed value, or a symbol: any value of at least 2 inside the symbol's
// range, equal for every dimension sharing the symbol), whether the innermost stride is 1, and
// whether the data is 64-byte aligned. Element types and ranks are part of the argument types, so
// a different one is a different compiled function, not a guard failure.
//
// Policies (options::dynamic), as torch.compile's:
//   never      every new combination of extents gets its own fully specialised code;
//   always     every `dyn` dimension is symbolic from the first call;
//   automatic  the first call specialises; when a guard fails because dimensions changed, the
//              next specialisation makes exactly those dimensions symbolic (dimensions with equal
//              extents share one symbol: "duck sizing"), so a batch dimension that varies costs two
//              compiles in all.
// Extents 0 and 1 are never symbolic (they change broadcasting), as in torch.compile.
// Depends on: core/shape.hpp, options.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/shape.hpp"
#include "fusebox/options.hpp"

namespace fusebox {

/// A recompile refused by error_on_recompile: names the guard that failed, old and new values.
struct recompile_error : error {
  using error::error;
};

/// A range (and an optimisation hint) for one dimension of one argument.
struct dim_hint {
  std::size_t arg = 0, dim = 0;
  std::size_t min = 2, max = dyn, opt = 0;
};

}  // namespace fusebox

namespace fusebox::jit {

/// What a call looks like to the guards.
struct call_facts {
  std::vector<dims> extents;  ///< per argument (rank 0 for non-tensor arguments)
  std::vector<bool> unit_inner, aligned;
  std::vector<std::uint32_t> dyn_mask;  ///< per argument: bit d set when dimension d is `dyn` in the type
  std::vector<int> payload_class;       ///< per node: which payload values are equal (jit/merge.hpp)
};

class guard {
 public:
  std::vector<dims> pattern;  ///< per argument: known extents, or symbol(k)
  std::vector<bool> unit_inner, aligned;
  std::vector<std::size_t> symbol_min, symbol_max;  ///< per symbol
  std::vector<int> payload_class;  ///< per node: the equal payload values the program merged

  std::size_t symbols() const { return symbol_min.size(); }

  /// Whether the call passes; otherwise `why` names the first failing check with both values.
  bool matches(const call_facts& c, std::string* why = nullptr) const;

  /// Text of the guard for logs: "[s0, 784] [784, 10]".
  std::string text() const;

 private:
  static bool fail(std::string* why, std::string w) {
    if (why) *why = std::move(w);
    return false;
  }
};

/// The guard of the next specialisation for a call that no existing guard accepted.
FUSEBOX_RUNTIME_API guard next_guard(const call_facts& c, fusebox::dynamic policy, const std::vector<guard>& existing,
                                     const std::vector<dim_hint>& hints);

/// Throws shape_error when an extent is outside the range its hint allows.
FUSEBOX_RUNTIME_API void check_hints(const call_facts& c, const std::vector<dim_hint>& hints);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API bool guard::matches(const call_facts& c, std::string* why) const {
  std::vector<std::size_t> bound(symbols(), dyn);
  for (std::size_t a = 0; a < pattern.size(); ++a) {
    for (std::size_t d = 0; d < pattern[a].rank; ++d) {
      const std::size_t want = pattern[a].extent[d], got = c.extents[a].extent[d];
      const std::string where = "argument " + std::to_string(a) + " dimension " + std::to_string(d);
      if (is_known_extent(want)) {
        if (want != got) return fail(why, where + ": specialised to " + std::to_string(want) + ", got " + std::to_string(got));
        continue;
      }
      const std::size_t k = want - symbol_base;
      if (got < symbol_min[k] || got > symbol_max[k])
        return fail(why, where + ": symbolic s" + std::to_string(k) + " in [" + std::to_string(symbol_min[k]) + ", " +
                             (symbol_max[k] == dyn ? std::string("inf") : std::to_string(symbol_max[k])) + "], got " +
                             std::to_string(got));
      if (bound[k] == dyn) bound[k] = got;
      else if (bound[k] != got)
        return fail(why, where + ": s" + std::to_string(k) + " is " + std::to_string(bound[k]) +
                             " elsewhere in this call, here " + std::to_string(got));
    }
    if (unit_inner[a] != c.unit_inner[a])
      return fail(why, "argument " + std::to_string(a) + ": innermost stride " +
                           (unit_inner[a] ? "was 1, now is not" : "was not 1, now is"));
    if (aligned[a] != c.aligned[a])
      return fail(why, "argument " + std::to_string(a) + ": 64-byte alignment " + (aligned[a] ? "lost" : "gained"));
  }
  for (std::size_t i = 0; i < payload_class.size() && i < c.payload_class.size(); ++i)
    if (payload_class[i] != c.payload_class[i]) {
      const bool was_merged = payload_class[i] != static_cast<int>(i);
      const int other = was_merged ? payload_class[i] : c.payload_class[i];
      return fail(why, "the scalar or captured tensor of node " + std::to_string(i) + (was_merged ? " was" : " was not") +
                           " equal to that of node " + std::to_string(other) + " (one computation serves both), now " +
                           (was_merged ? "differs" : "is equal"));
    }
  return true;
}

FUSEBOX_RUNTIME_API std::string guard::text() const {
  std::string s;
  for (const auto& p : pattern) s += (s.empty() ? "" : " ") + to_string(p);
  return s;
}

FUSEBOX_RUNTIME_API guard next_guard(const call_facts& c, fusebox::dynamic policy, const std::vector<guard>& existing,
                                     const std::vector<dim_hint>& hints) {
  guard g;
  g.pattern = c.extents;
  g.unit_inner = c.unit_inner;
  g.aligned = c.aligned;
  g.payload_class = c.payload_class;
  auto hinted = [&](std::size_t a, std::size_t d) -> const dim_hint* {
    for (const auto& h : hints)
      if (h.arg == a && h.dim == d) return &h;
    return nullptr;
  };
  // Which dimensions become symbolic.
  std::vector<std::vector<bool>> sym(c.extents.size());
  for (std::size_t a = 0; a < c.extents.size(); ++a) {
    sym[a].assign(c.extents[a].rank, false);
    for (std::size_t d = 0; d < c.extents[a].rank; ++d) {
      if (!(c.dyn_mask[a] >> d & 1u) || c.extents[a].extent[d] < 2) continue;
      bool s = policy == fusebox::dynamic::always;
      if (policy == fusebox::dynamic::automatic && !existing.empty()) {
        const guard& last = existing.back();
        const std::size_t before = last.pattern[a].extent[d];
        s = !is_known_extent(before) || before != c.extents[a].extent[d];
      }
      sym[a][d] = s;
    }
  }
  // Duck sizing: symbolic dimensions with equal extents share a symbol.
  std::vector<std::size_t> value_of_symbol;
  for (std::size_t a = 0; a < c.extents.size(); ++a)
    for (std::size_t d = 0; d < c.extents[a].rank; ++d) {
      if (!sym[a][d]) continue;
      const std::size_t v = c.extents[a].extent[d];
      std::size_t k = 0;
      while (k < value_of_symbol.size() && value_of_symbol[k] != v) ++k;
      if (k == value_of_symbol.size()) {
        value_of_symbol.push_back(v);
        g.symbol_min.push_back(2);
        g.symbol_max.push_back(dyn);
      }
      if (const dim_hint* h = hinted(a, d)) {
        g.symbol_min[k] = std::max(g.symbol_min[k], h->min);
        g.symbol_max[k] = std::min(g.symbol_max[k], h->max);
      }
      g.pattern[a].extent[d] = symbol(k);
    }
  return g;
}

FUSEBOX_RUNTIME_API void check_hints(const call_facts& c, const std::vector<dim_hint>& hints) {
  for (const auto& h : hints) {
    if (h.arg >= c.extents.size() || h.dim >= c.extents[h.arg].rank) continue;
    const std::size_t v = c.extents[h.arg].extent[h.dim];
    if (v < h.min || v > h.max)
      FUSEBOX_THROW(shape_error("argument " + std::to_string(h.arg) + " dimension " + std::to_string(h.dim) + " is " +
                                    std::to_string(v) + ", outside its declared range [" + std::to_string(h.min) + ", " +
                                    (h.max == dyn ? std::string("inf") : std::to_string(h.max)) + "]",
                                std::source_location{}));
  }
}
#endif

}  // namespace fusebox::jit
