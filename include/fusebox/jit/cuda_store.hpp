// jit/cuda_store.hpp: where a generated CUDA program's kernels come from. All kernels of one
// program are one NVRTC unit (the prelude once, each distinct kernel in a namespace of its own with
// entry points named by its digest): memory first (full key), then the disk cache (content hash and
// full key checked before the cubin is loaded), then NVRTC, whose cubin is published to the disk.
//
// The key covers what is baked into the cubin: the unit's source (op structure, extents, storage
// type, contiguity), the code generator's version, the GPU architecture, NVRTC's version and
// options, and the fusebox version. Identical kernels within a program share one entry, so a
// stack of identical blocks compiles one block's kernels.
//
// `cuda_unit` (rendering only) needs no GPU: CI compiles every unit with NVRTC for sm_90 to catch
// code-generation errors on machines without one.
// Depends on: jit/{codegen_cuda,cache_key,disk_cache,memory_cache,counters,logs}.hpp,
// cuda/{nvrtc,module,driver}.hpp, profile.hpp, version.hpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/cuda/driver.hpp"
#include "fusebox/cuda/module.hpp"
#include "fusebox/cuda/nvrtc.hpp"
#include "fusebox/jit/cache_key.hpp"
#include "fusebox/jit/codegen_cuda.hpp"
#include "fusebox/jit/counters.hpp"
#include "fusebox/jit/disk_cache.hpp"
#include "fusebox/jit/logs.hpp"
#include "fusebox/jit/memory_cache.hpp"
#include "fusebox/profile.hpp"
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

inline cuda_unit make_cuda_unit(const std::vector<rendered_cuda_kernel>& kernels) {
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

/// A loaded program unit: the module and, per kernel, its three functions.
struct cuda_binary {
  std::shared_ptr<cuda::module> module;
  std::vector<cuda::CUfunction> wide_entry, vector_entry, scalar_entry;
};

class cuda_store {
 public:
  static cuda_store& instance() {
    static cuda_store store;
    return store;
  }

  /// NVRTC options of every unit: `--use_fast_math` only when asked for (options::fast_math).
  static std::vector<std::string> options(bool fast_math) {
    std::vector<std::string> o{"-lineinfo"};
    if (fast_math) o.push_back("--use_fast_math");
    return o;
  }

  /// Compiles (or finds) the unit of `kernels` for the current device and loads it. Throws
  /// compile_failure-like fusebox::cuda::nvrtc_error with the log and the source on a bad unit.
  cuda_binary get(const std::vector<rendered_cuda_kernel>& kernels, bool fast_math) {
    const cuda::device_info& dev = cuda::current_device();
    const cuda_unit unit = make_cuda_unit(kernels);
    cache_key key;
    key.add("fusebox", version_string)
        .add("codegen", std::to_string(cuda_codegen_version))
        .add("arch", dev.arch)
        .add("nvrtc", cuda::nvrtc_version())
        .add("options", [&] {
          std::string o;
          for (const auto& x : options(fast_math)) o += x + " ";
          return o;
        }())
        .add("source", unit.source);
    auto mod = memory_.find(key);
    if (mod) {
      counters().hits.fetch_add(1, std::memory_order_relaxed);
    } else {
      counters().misses.fetch_add(1, std::memory_order_relaxed);
      std::vector<char> cubin;
      if (disk_.enabled()) {
        if (auto found = disk_.lookup_blob(key)) {
          profile::instant("cubin disk hit", "cache", key.digest().substr(0, 16));
          cubin.assign(found->begin(), found->end());
        }
      }
      if (cubin.empty()) {
        check_compile_allowed("an NVRTC unit of " + std::to_string(unit.distinct) + " CUDA kernel(s)");
        profile::scoped_span span("nvrtc compile", "compile", std::to_string(unit.distinct) + " kernel(s)");
        const auto start = std::chrono::steady_clock::now();
        counters().compiles.fetch_add(1, std::memory_order_relaxed);
        cuda::compile_result built;
        try {
          built = cuda::nvrtc_compile(unit.source, "fusebox_cuda_kernels", dev.arch, options(fast_math));
        } catch (...) {
          counters().compile_failures.fetch_add(1, std::memory_order_relaxed);
          throw;
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        counters().add_compile_seconds(seconds);
        counters().kernels_compiled.fetch_add(unit.distinct, std::memory_order_relaxed);
        std::string what;
        for (const auto& k : kernels) what += "\n  " + k.summary;
        log(log_category::kernels, std::to_string(unit.distinct) + " CUDA kernel(s) compiled by NVRTC for " + dev.arch +
                                       " in " + std::to_string(seconds) + " s:" + what);
        log(log_category::output_code, "CUDA unit:\n" + unit.source);
        cubin = std::move(built.cubin);
        if (disk_.enabled()) disk_.store_blob(key, std::string_view(cubin.data(), cubin.size()));
      }
      auto loaded = std::make_shared<cuda::module>(std::span<const char>(cubin.data(), cubin.size()), "fusebox kernels");
      mod = memory_.get_or_create(key, [&] { return std::shared_ptr<cuda::module>(loaded); });
    }
    cuda_binary b;
    b.module = *mod;
    for (std::size_t i = 0; i < unit.entry.size(); ++i) {
      const std::string& e = unit.entry[i];
      // Attention kernels have no 32-bytes-a-thread entry (jit/cuda_attention.hpp).
      b.wide_entry.push_back(kernels[i].kind == plan::kernel_kind::attention ? nullptr : b.module->function(e + "_w"));
      b.vector_entry.push_back(b.module->function(e));
      b.scalar_entry.push_back(b.module->function(e + "_v1"));
    }
    return b;
  }

  void clear_memory() { memory_.clear(); }

 private:
  disk_cache disk_;
  memory_cache<std::shared_ptr<cuda::module>> memory_;
};

}  // namespace fusebox::jit
