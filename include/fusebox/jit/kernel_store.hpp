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

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
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
#include "fusebox/profile.hpp"
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
        profile::instant("kernel cache hit", "cache", rs[i].summary);
        out[i] = binary(*hit, rs[i]);
        continue;
      }
      counters().misses.fetch_add(1, std::memory_order_relaxed);
      if (disk_.enabled()) {
        if (const disk_lookup found = disk_.find(keys[i]); found.path) {
          profile::instant("kernel disk hit", "cache", rs[i].summary);
          out[i] = binary(remember(keys[i], load(*found.path, symbol_of(keys[i]))), rs[i]);
          continue;
        }
      }
      missing.push_back(i);
    }
    if (missing.empty()) return out;
    // One translation unit: the prelude once, then each distinct kernel under its own symbol
    // (identical kernels in one request share a key, so they share the symbol too).
    std::vector<std::size_t> distinct;
    for (std::size_t i : missing) {
      bool seen = false;
      for (std::size_t d : distinct) seen = seen || keys[d].canonical == keys[i].canonical;
      if (!seen) distinct.push_back(i);
    }
    std::string unit = "// fusebox generated kernels (" + std::to_string(distinct.size()) + ")\n";
    for (std::size_t m = 0; m < distinct.size(); ++m) {
      const std::size_t i = distinct[m];
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
    compile_result built = compiler_for_kernels().compile(unit, "fusebox_kernels");
    if (!built.ok) throw compile_failure("fusebox: generated kernels failed to compile", unit, built.log);
    counters().kernels_compiled.fetch_add(distinct.size(), std::memory_order_relaxed);
    std::string what;
    for (std::size_t i : distinct) what += "\n  " + rs[i].summary;
    log(log_category::kernels, std::to_string(distinct.size()) + " kernel(s) compiled in " +
                                   std::to_string(built.seconds) + " s:" + what);
    std::optional<std::filesystem::path> stored;
    for (std::size_t i : distinct)
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
  const host_compiler& compiler() const noexcept { return *compiler_; }

  /// Replaces the compiler (and drops the precompiled prelude): for tests and for programs that
  /// want other flags than FUSEBOX_CXX / FUSEBOX_CXXFLAGS gave at start-up. Keys change with it.
  void use_compiler(host_compiler_options o) {
    std::call_once(pch_once_, [] {});
    std::lock_guard lock(compiler_mutex_);
    compiler_ = std::make_unique<host_compiler>(std::move(o));
    pch_compiler_.reset();
  }

 private:
  using loaded_ptr = std::shared_ptr<const detail::loaded_kernel>;

  cache_key key_of(const rendered_kernel& r) const {
    cache_key key;
    key.add("fusebox", version_string)
        .add("codegen", std::to_string(codegen_version))
        .add("compiler", compiler_->identity())
        .add("cpu", detail::cpu_identity())
        .add("fast_math", r.fast_math)  // the source says so too; the key never relies on that
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

  /// The compiler with the precompiled prelude in front of the include path (built on first use;
  /// FUSEBOX_JIT_PCH=0 turns it off). The prelude is most of a kernel's compile time; with it a
  /// program's kernels compile in a fraction of a second. The key does not change: the code is the
  /// same, only the compiler's work is.
  const host_compiler& compiler_for_kernels() {
    std::call_once(pch_once_, [this] {
      const char* env = std::getenv("FUSEBOX_JIT_PCH");
      if (env && std::string(env) == "0") return;
      try {
        if (auto dir = build_pch()) {
          host_compiler_options o;
          o.flags = host_compiler::default_flags();
          o.flags.insert(o.flags.begin(), "-I" + dir->string());
          o.flags.push_back("-Winvalid-pch");
          pch_compiler_ = std::make_unique<host_compiler>(o);
        }
      } catch (const std::exception& e) {
        warn(std::string("fusebox: precompiled prelude unavailable (") + e.what() + "); compiling without it");
      }
    });
    std::lock_guard lock(compiler_mutex_);
    return pch_compiler_ ? *pch_compiler_ : *compiler_;
  }

  /// Hash of the headers the prelude pulls in, so an edited header never meets a stale PCH.
  static std::string prelude_digest(const std::filesystem::path& include) {
    sha256 h;
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (auto it = std::filesystem::recursive_directory_iterator(include / "fusebox", ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file() && it->path().extension() == ".hpp") files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      h.update(f.lexically_relative(include).string());
      h.update(text);
    }
    return hex(h.finish()).substr(0, 24);
  }

  /// Builds `<root>/fusebox/jit/prelude.hpp.gch` with the kernels' own flags; returns <root>.
  std::optional<std::filesystem::path> build_pch() {
    const std::filesystem::path include = detail::fusebox_include_dir();
    if (include.empty()) return std::nullopt;
    cache_key k;
    k.add("compiler", compiler_->identity()).add("headers", prelude_digest(include));
    const std::filesystem::path parent = disk_.enabled() ? disk_.directory() : detail::temp_root();
    const std::filesystem::path root = parent / ("pch-" + k.digest().substr(0, 24));
    const std::filesystem::path gch = root / "fusebox" / "jit" / "prelude.hpp.gch";
    std::error_code ec;
    if (std::filesystem::is_regular_file(gch, ec)) return root;
    temp_directory staging(parent, "pch-staging-");
    std::filesystem::create_directories(staging.path() / "fusebox" / "jit");
    std::vector<std::string> argv{compiler_->compiler()};
    for (const auto& f : compiler_->flags())
      if (f != "-shared") argv.push_back(f);
    argv.insert(argv.end(), {"-x", "c++-header", (include / "fusebox" / "jit" / "prelude.hpp").string(), "-o",
                             (staging.path() / "fusebox" / "jit" / "prelude.hpp.gch").string()});
    const auto start = std::chrono::steady_clock::now();
    const auto run = detail::run_process(argv, staging.path() / "log.txt", staging.path(), 600);
    if (!run.exited || run.status != 0) return std::nullopt;
    std::filesystem::remove(staging.path() / "log.txt", ec);
    std::filesystem::rename(staging.path(), root, ec);  // another process may have won: fine
    if (!std::filesystem::is_regular_file(gch, ec)) return std::nullopt;
    log(log_category::kernels, "precompiled the kernel prelude in " +
                                   std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()) +
                                   " s: " + gch.string());
    return root;
  }

  std::unique_ptr<host_compiler> compiler_ = std::make_unique<host_compiler>();
  std::once_flag pch_once_;
  std::unique_ptr<host_compiler> pch_compiler_;
  std::mutex compiler_mutex_;
  disk_cache disk_;
  memory_cache<loaded_ptr> memory_;
};

}  // namespace fusebox::jit
