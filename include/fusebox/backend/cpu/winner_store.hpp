// backend/cpu/winner_store.hpp: where the CPU's max_autotune winners (backend/cpu/autotune.hpp) persist: the
// kernel cache directory, as blobs like the CUDA tuners' (backend/cuda/autotune.hpp), under the same
// trust rules (runtime/disk_cache.hpp: a trusted directory, entries published by one rename, the full
// key and the content hash checked before use). Key: what is chosen, fusebox's version, the CPU
// (model and flags, as the kernel keys), the candidate count and the problem (kernel, extents,
// layouts, dtype, threads). Value: the winner's index, then its name for people reading the cache.
// Depends on: backend/cpu/autotune.hpp, runtime/{cache_key,disk_cache,kernel_store}.hpp, version.hpp.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "fusebox/backend/cpu/autotune.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/kernel_store.hpp"
#include "fusebox/version.hpp"

namespace fusebox::jit {

class cpu_winner_store final : public cpu::autotune::store {
 public:
  /// The process's store (the default cache directory, checked once).
  static cpu_winner_store& instance() {
    static cpu_winner_store* s = new cpu_winner_store;  // never destroyed, like the kernel store
    return *s;
  }

  std::optional<std::size_t> load(const std::string& problem, std::size_t candidates) override;
  void save(const std::string& problem, std::size_t candidates, std::size_t winner, const std::string& name) override;
  std::string where() const override;

 private:
  static cache_key key_for(const std::string& problem, std::size_t candidates);
  disk_cache disk_;
};

namespace detail {
inline cpu::autotune::store* cpu_winner_store_instance() { return &cpu_winner_store::instance(); }
/// Makes this store max_autotune's (cpu::autotune::persistent_store) in every program with a unit
/// that includes this header. Registering compiles the store and the disk cache into the unit
/// (~2 CPU-s): a program that defines FUSEBOX_EXTERN_RUNTIME everywhere registers it only in the
/// one unit that also defines FUSEBOX_IMPLEMENTATION (README, "Build time").
#if !defined(FUSEBOX_EXTERN_RUNTIME) || defined(FUSEBOX_IMPLEMENTATION)
inline const bool cpu_winner_store_registered = (cpu::autotune::persistent_store = &cpu_winner_store_instance, true);
#endif
}  // namespace detail

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API std::optional<std::size_t> cpu_winner_store::load(const std::string& problem,
                                                                     std::size_t candidates) {
  if (!disk_.enabled()) return std::nullopt;
  const auto blob = disk_.lookup_blob(key_for(problem, candidates));
  std::size_t i = 0;
  if (!blob || std::sscanf(blob->c_str(), "%zu", &i) != 1) return std::nullopt;
  return i;
}

FUSEBOX_RUNTIME_API void cpu_winner_store::save(const std::string& problem, std::size_t candidates, std::size_t winner,
                                                const std::string& name) {
  if (disk_.enabled()) disk_.store_blob(key_for(problem, candidates), std::to_string(winner) + " " + name + "\n");
}

FUSEBOX_RUNTIME_API std::string cpu_winner_store::where() const {
  return disk_.enabled() ? disk_.directory().string() : "memory only (cache disabled: " + disk_.disabled_reason() + ")";
}

FUSEBOX_RUNTIME_API cache_key cpu_winner_store::key_for(const std::string& problem, std::size_t candidates) {
  cache_key key;
  key.add("fusebox", version_string)
      .add("what", "CPU max_autotune choice")
      .add("cpu", detail::cpu_identity())
      .add("candidates", candidates)
      .add("problem", problem);
  return key;
}
#endif

}  // namespace fusebox::jit
