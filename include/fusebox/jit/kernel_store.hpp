// jit/kernel_store.hpp: where a generated kernel comes from. Memory first (full key), then the
// disk cache (content hash and full key checked before anything is loaded), then the host
// compiler, whose output is published to the disk cache. Identical kernels have identical source
// and so one key: a stack of identical blocks compiles one block's kernels.
//
// The key covers everything baked into the object: the source (op structure, extents, element
// type, contiguity), the code generator's version, the compiler's identity and full flags, the
// CPU the code is built for (-march=native), and the fusebox version.
// Depends on: jit/{host_compiler,disk_cache,memory_cache,cache_key,shared_library,counters,logs,
// codegen_cpu,program}.hpp, version.hpp.
#pragma once

#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "fusebox/jit/cache_key.hpp"
#include "fusebox/jit/codegen_cpu.hpp"
#include "fusebox/jit/counters.hpp"
#include "fusebox/jit/disk_cache.hpp"
#include "fusebox/jit/host_compiler.hpp"
#include "fusebox/jit/logs.hpp"
#include "fusebox/jit/memory_cache.hpp"
#include "fusebox/jit/program.hpp"
#include "fusebox/jit/shared_library.hpp"
#include "fusebox/version.hpp"

namespace fusebox::jit {

/// Bumped whenever generated code changes meaning, so old cache entries stop matching.
inline constexpr int codegen_version = 1;

/// A generated kernel could not be compiled: the caller falls back to eager (or throws under
/// fullgraph); the source and the compiler's log are kept for the report.
struct compile_failure : fusebox::error {
  compile_failure(std::string what, std::string source_, std::string log_)
      : fusebox::error(std::move(what)), source(std::move(source_)), log(std::move(log_)) {}
  std::string source, log;
};

namespace detail {
/// The CPU the code is built for: model name and feature flags (-march=native bakes them in).
inline const std::string& cpu_identity() {
  static const std::string id = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line) && (model.empty() || flags.empty())) {
      if (model.empty() && line.rfind("model name", 0) == 0) model = line;
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
    }
    return model + "|" + flags;
  }();
  return id;
}

struct loaded_kernel {
  std::shared_ptr<shared_library> shared;  // one object may hold several kernels
  void* fn = nullptr;
};
}  // namespace detail

class kernel_store {
 public:
  static kernel_store& instance() {
    static kernel_store store;
    return store;
  }

  /// The compiled kernel for each of `rs`, loaded. Kernels found in neither cache are compiled
  /// together, in one run of the host compiler (one translation unit, one symbol per kernel),
  /// and the object is published under each kernel's key. Throws compile_failure (or
  /// compile_forbidden).
  std::vector<kernel_binary> get_all(const std::vector<rendered_kernel>& rs) {
    std::vector<kernel_binary> out(rs.size());
    std::vector<cache_key> keys;
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < rs.size(); ++i) {
      keys.push_back(key_of(rs[i]));
      if (auto hit = memory_.find(keys[i])) {
        counters().hits.fetch_add(1, std::memory_order_relaxed);
        out[i] = binary(*hit, rs[i]);
        continue;
      }
      counters().misses.fetch_add(1, std::memory_order_relaxed);
      if (disk_.enabled()) {
        if (const disk_lookup found = disk_.find(keys[i]); found.path) {
          out[i] = binary(remember(keys[i], load(*found.path, symbol_of(keys[i]))), rs[i]);
          continue;
        }
      }
      missing.push_back(i);
    }
    if (missing.empty()) return out;
    // One translation unit: the prelude once, then each kernel under its own symbol.
    std::string unit = "// fusebox generated kernels (" + std::to_string(missing.size()) + ")\n";
    for (std::size_t m = 0; m < missing.size(); ++m) {
      const std::size_t i = missing[m];
      std::string src = rs[i].source;
      const std::string sym = symbol_of(keys[i]);
      if (const auto at = src.find(std::string(kernel_symbol) + "("); at != std::string::npos)
        src.replace(at, std::string(kernel_symbol).size(), sym);
      if (m > 0)
        if (const auto inc = src.find("#include \"fusebox/jit/prelude.hpp\""); inc != std::string::npos)
          src.erase(inc, src.find('\n', inc) - inc);
      unit += src + "\n";
      log(log_category::output_code, "kernel " + sym + ":\n" + rs[i].source);
    }
    compile_result built = compiler_.compile(unit, "fusebox_kernels");
    if (!built.ok) throw compile_failure("fusebox: generated kernels failed to compile", unit, built.log);
    std::string what;
    for (std::size_t i : missing) what += "\n  " + rs[i].summary;
    log(log_category::kernels, std::to_string(missing.size()) + " kernel(s) compiled in " +
                                   std::to_string(built.seconds) + " s:" + what);
    std::optional<std::filesystem::path> stored;
    for (std::size_t i : missing)
      if (disk_.enabled()) stored = disk_.store(keys[i], built.library);
    // Load from the cache when it has the object (it outlives the compiler's temporary directory).
    auto library = std::make_shared<shared_library>(stored ? *stored : built.library);
    for (std::size_t i : missing) {
      auto k = std::make_shared<detail::loaded_kernel>();
      k->shared = library;
      k->fn = library->symbol(symbol_of(keys[i]).c_str());
      out[i] = binary(remember(keys[i], k), rs[i]);
    }
    return out;
  }

  /// Forgets the loaded kernels (objects stay loaded while programs use them).
  void clear_memory() { memory_.clear(); }
  disk_cache& disk() noexcept { return disk_; }
  const host_compiler& compiler() const noexcept { return compiler_; }

 private:
  using loaded_ptr = std::shared_ptr<const detail::loaded_kernel>;

  cache_key key_of(const rendered_kernel& r) const {
    cache_key key;
    key.add("fusebox", version_string)
        .add("codegen", std::to_string(codegen_version))
        .add("compiler", compiler_.identity())
        .add("cpu", detail::cpu_identity())
        .add("source", r.source);
    return key;
  }
  static std::string symbol_of(const cache_key& key) {
    return std::string(kernel_symbol) + "_" + key.digest().substr(0, 24);
  }
  static loaded_ptr load(const std::filesystem::path& path, const std::string& symbol) {
    auto k = std::make_shared<detail::loaded_kernel>();
    k->shared = std::make_shared<shared_library>(path);
    k->fn = k->shared->symbol(symbol.c_str());
    return k;
  }
  loaded_ptr remember(const cache_key& key, loaded_ptr k) {
    return memory_.get_or_create(key, [&] { return k; });
  }
  static kernel_binary binary(const loaded_ptr& k, const rendered_kernel& r) {
    kernel_binary b;
    b.fn = k->fn;
    b.locals = r.locals;
    b.owner = k;
    b.summary = r.summary;
    return b;
  }

  host_compiler compiler_;
  disk_cache disk_;
  memory_cache<loaded_ptr> memory_;
};

}  // namespace fusebox::jit
