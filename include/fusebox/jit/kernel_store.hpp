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
  shared_library library;
  void* fn = nullptr;
};
}  // namespace detail

class kernel_store {
 public:
  static kernel_store& instance() {
    static kernel_store store;
    return store;
  }

  /// The compiled kernel for `r`, loaded. Throws compile_failure (or compile_forbidden).
  kernel_binary get(const rendered_kernel& r) {
    cache_key key;
    key.add("fusebox", version_string)
        .add("codegen", std::to_string(codegen_version))
        .add("compiler", compiler_.identity())
        .add("cpu", detail::cpu_identity())
        .add("source", r.source);
    cache_outcome outcome{};
    auto loaded = memory_.get_or_create(key, [&] { return load_or_compile(key, r); }, &outcome);
    if (outcome == cache_outcome::hit) counters().hits.fetch_add(1, std::memory_order_relaxed);
    kernel_binary b;
    b.fn = loaded->fn;
    b.locals = r.locals;
    b.owner = loaded;
    b.summary = r.summary;
    return b;
  }

  /// Forgets the loaded kernels (objects stay loaded while programs use them).
  void clear_memory() { memory_.clear(); }
  disk_cache& disk() noexcept { return disk_; }
  const host_compiler& compiler() const noexcept { return compiler_; }

 private:
  std::shared_ptr<const detail::loaded_kernel> load_or_compile(const cache_key& key, const rendered_kernel& r) {
    counters().misses.fetch_add(1, std::memory_order_relaxed);
    auto k = std::make_shared<detail::loaded_kernel>();
    if (disk_.enabled()) {
      const disk_lookup found = disk_.find(key);
      if (found.path) {
        k->library = shared_library(*found.path);
        k->fn = k->library.symbol(kernel_symbol);
        return k;
      }
    }
    log(log_category::output_code, "kernel " + key.digest().substr(0, 16) + ":\n" + r.source);
    compile_result built = compiler_.compile(r.source, "fusebox_kernel");
    if (!built.ok) {
      counters().compile_failures.fetch_add(1, std::memory_order_relaxed);
      throw compile_failure("fusebox: generated kernel failed to compile (" + r.summary + ")", r.source, built.log);
    }
    log(log_category::kernels, "compiled in " + std::to_string(built.seconds) + " s: " + r.summary);
    std::filesystem::path lib = built.library;
    if (disk_.enabled())
      if (auto stored = disk_.store(key, built.library)) lib = *stored;
    k->library = shared_library(lib);
    k->fn = k->library.symbol(kernel_symbol);
    return k;
  }

  host_compiler compiler_;
  disk_cache disk_;
  memory_cache<std::shared_ptr<const detail::loaded_kernel>> memory_;
};

}  // namespace fusebox::jit
