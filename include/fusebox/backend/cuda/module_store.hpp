// backend/cuda/module_store.hpp: where a generated CUDA program's kernels come from. Each distinct kernel
// is one NVRTC unit (the prelude, then the kernel in a namespace of its own with entry points named
// by its digest): memory first (full key), then the disk cache (content hash and full key checked
// before the cubin is loaded), then NVRTC, whose cubin is published to the disk. The units a
// program misses are compiled at once, one thread each (NVRTC is thread-safe; ptxas, most of a
// unit's cost, is single-threaded), so a cold program costs its slowest kernel rather than the sum:
// W4's attention kernel alone is ~0.3 s of ptxas.
//
// The key covers what is baked into the cubin: the unit's source (op structure, extents, storage
// type, contiguity), the code generator's version, the GPU architecture, NVRTC's version and
// options, and the fusebox version. Identical kernels share one unit, within a program and across
// programs, so a stack of identical blocks compiles one block's kernels.
//
// `make_cuda_unit` (rendering only) needs no GPU: CI compiles every kernel with NVRTC for sm_90
// to catch code-generation errors on machines without one.
// Depends on: backend/cuda/codegen.hpp, runtime/{cache_key,disk_cache,memory_cache,counters,logs}.hpp,
// backend/cuda/{nvrtc,module,driver}.hpp, core/linkage.hpp, profile.hpp, version.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/backend/cuda/nvrtc.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/memory_cache.hpp"
#include "fusebox/version.hpp"

namespace fusebox::jit {

/// Bumped whenever generated CUDA changes meaning, so old cache entries stop matching.
inline constexpr int cuda_codegen_version = 1;

/// One NVRTC unit for a program's kernels: the source, and each kernel's entry point names.
struct cuda_unit {
  std::string source;
  std::vector<std::string> entry;     ///< per kernel: the vector entry point ("<entry>_v1": scalar)
  std::size_t distinct = 0;           ///< kernels actually in the unit (identical ones share)
};

FUSEBOX_RUNTIME_API cuda_unit make_cuda_unit(const std::vector<rendered_cuda_kernel>& kernels);

/// A program's loaded kernels: per kernel, its module (shared by identical kernels, within and
/// across programs) and its three functions.
struct cuda_binary {
  std::vector<std::shared_ptr<cuda::module>> modules;
  std::vector<cuda::CUfunction> wide_entry, vector_entry, scalar_entry;
};

class cuda_store {
 public:
  static cuda_store& instance() {
    static cuda_store store;
    return store;
  }

  /// NVRTC options of every unit: `--use_fast_math` only when asked for (options::fast_math).
  static std::vector<std::string> options(bool fast_math);

  /// Compiles (or finds) a unit per kernel of `kernels` for the current device and loads them.
  /// Throws fusebox::cuda::nvrtc_error with the log and the source on a bad unit.
  cuda_binary get(const std::vector<rendered_cuda_kernel>& kernels, bool fast_math);

  void clear_memory() { memory_.clear(); }

 private:
  static cache_key unit_key(const cuda_unit& unit, const std::string& arch, bool fast_math);

  /// NVRTC on every unit of `todo`, a thread each up to the machine's cores; the first failure is
  /// rethrown after all have finished; then the cubins go to the disk cache.
  template <class Entry>
  void compile_all(const std::vector<Entry*>& todo, const std::string& arch, bool fast_math) {
    check_compile_allowed(std::to_string(todo.size()) + " NVRTC unit(s) of one CUDA kernel each");
    const std::size_t threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, todo.size());
    profile::scoped_span span("nvrtc compile", "compile",
                              std::to_string(todo.size()) + " kernel(s) on " + std::to_string(threads) + " thread(s)");
    const auto start = std::chrono::steady_clock::now();
    std::atomic<std::size_t> next{0};
    std::vector<std::exception_ptr> failed(todo.size());
    auto work = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < todo.size();) {
        Entry& e = *todo[i];
        const auto t0 = std::chrono::steady_clock::now();
        counters().compiles.fetch_add(1, std::memory_order_relaxed);
        try {
          e.cubin = cuda::nvrtc_compile(e.unit.source, "fusebox_cuda_kernel", arch, options(fast_math)).cubin;
        } catch (...) {
          counters().compile_failures.fetch_add(1, std::memory_order_relaxed);
          failed[i] = std::current_exception();
          continue;
        }
        e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        counters().kernels_compiled.fetch_add(1, std::memory_order_relaxed);
      }
    };
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    counters().add_compile_seconds(seconds);
    for (const auto& f : failed)
      if (f) std::rethrow_exception(f);
    if (disk_.enabled())  // here, not on the workers: the cache's eviction scan is not made for threads of one process
      for (const Entry* e : todo) disk_.store_blob(e->key, std::string_view(e->cubin.data(), e->cubin.size()));
    std::string what;
    for (const Entry* e : todo) what += "\n  " + std::to_string(e->seconds).substr(0, 5) + " s  " + e->summary;
    log(log_category::kernels, std::to_string(todo.size()) + " CUDA kernel(s) compiled by NVRTC for " + arch + " in " +
                                   std::to_string(seconds) + " s on " + std::to_string(threads) + " thread(s):" + what);
    for (const Entry* e : todo) log(log_category::output_code, "CUDA unit:\n" + e->unit.source);
  }

  disk_cache disk_;
  memory_cache<std::shared_ptr<cuda::module>> memory_;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API cuda_unit make_cuda_unit(const std::vector<rendered_cuda_kernel>& kernels) {
  cuda_unit u;
  u.source = cuda_prelude();
  std::vector<std::string> seen;
  for (const auto& k : kernels) {
    const std::string name = "fbk_" + sha256_hex(k.source).substr(0, 20);
    u.entry.push_back(name);
    bool dup = false;
    for (const auto& s : seen) dup = dup || s == name;
    if (dup) continue;
    seen.push_back(name);
    // Entry points keep C linkage (unmangled names for cuModuleGetFunction) and so must be unique
    // in the unit; everything else lives in the kernel's namespace.
    std::string src = k.source;
    for (const auto& [from, suffix] : {std::pair<std::string, std::string>{"fusebox_kernel_w(", "_w("},
                                        {"fusebox_kernel_v1(", "_v1("}, {"fusebox_kernel(", "("}}) {
      if (auto at = src.find(from); at != std::string::npos) src.replace(at, from.size(), name + suffix);
    }
    u.source += "namespace " + name + " {\n" + src + "}  // namespace " + name + "\n";
  }
  u.distinct = seen.size();
  return u;
}

FUSEBOX_RUNTIME_API std::vector<std::string> cuda_store::options(bool fast_math) {
  std::vector<std::string> o{"-lineinfo"};
  if (fast_math) o.push_back("--use_fast_math");
  return o;
}

FUSEBOX_RUNTIME_API cuda_binary cuda_store::get(const std::vector<rendered_cuda_kernel>& kernels, bool fast_math) {
  const cuda::device_info& dev = cuda::current_device();
  // One entry per distinct kernel; `of[i]` is kernel i's.
  struct unit_entry {
    cuda_unit unit;
    cache_key key;
    std::string summary;
    std::shared_ptr<cuda::module> module;
    std::vector<char> cubin;
    double seconds = 0;
  };
  std::vector<unit_entry> units;
  std::vector<std::size_t> of;
  for (const auto& k : kernels) {
    cuda_unit u = make_cuda_unit({k});
    std::size_t at = 0;
    while (at < units.size() && units[at].unit.entry[0] != u.entry[0]) ++at;
    of.push_back(at);
    if (at < units.size()) continue;
    unit_entry e;
    e.key = unit_key(u, dev.arch, fast_math);
    e.unit = std::move(u);
    e.summary = k.summary;
    units.push_back(std::move(e));
  }

  std::vector<unit_entry*> to_compile;
  for (profile::scoped_span lookup("kernel lookup", "cache", std::to_string(units.size()) + " unit(s)");
       auto& e : units) {
    if (auto mod = memory_.find(e.key)) {
      counters().hits.fetch_add(1, std::memory_order_relaxed);
      e.module = *mod;
      continue;
    }
    counters().misses.fetch_add(1, std::memory_order_relaxed);
    if (disk_.enabled()) {
      if (auto found = disk_.lookup_blob(e.key)) {
        profile::instant("cubin disk hit", "cache", e.key.digest().substr(0, 16));
        e.cubin.assign(found->begin(), found->end());
        continue;
      }
    }
    to_compile.push_back(&e);
  }
  if (!to_compile.empty()) compile_all(to_compile, dev.arch, fast_math);

  profile::scoped_span load("module load", "cache");
  for (auto& e : units) {
    if (e.module) continue;
    auto loaded = std::make_shared<cuda::module>(std::span<const char>(e.cubin.data(), e.cubin.size()),
                                                 "fusebox kernel " + e.unit.entry[0]);
    e.module = memory_.get_or_create(e.key, [&] { return loaded; });
    e.cubin = {};
  }

  cuda_binary b;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    const unit_entry& e = units[of[i]];
    const std::string& name = e.unit.entry[0];
    b.modules.push_back(e.module);
    // The attention forward has no 32-bytes-a-thread entry (backend/cuda/attention_kernel.hpp); its
    // gradient's unit has one (its dq kernel: backend/cuda/attention_backward_kernel.hpp).
    const bool no_wide = kernels[i].kind == plan::kernel_kind::attention &&
                         kernels[i].source.find("fusebox_kernel_w(") == std::string::npos;
    b.wide_entry.push_back(no_wide ? nullptr : e.module->function(name + "_w"));
    b.vector_entry.push_back(e.module->function(name));
    b.scalar_entry.push_back(e.module->function(name + "_v1"));
  }
  return b;
}

FUSEBOX_RUNTIME_API cache_key cuda_store::unit_key(const cuda_unit& unit, const std::string& arch, bool fast_math) {
  cache_key key;
  std::string o;
  for (const auto& x : options(fast_math)) o += x + " ";
  key.add("fusebox", version_string)
      .add("codegen", std::to_string(cuda_codegen_version))
      .add("arch", arch)
      .add("nvrtc", cuda::nvrtc_version())
      .add("options", o)
      .add("source", unit.source);
  return key;
}
#endif

}  // namespace fusebox::jit
