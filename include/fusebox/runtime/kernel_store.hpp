// runtime/kernel_store.hpp: where a generated kernel comes from. Memory first (full key), then the
// disk cache (content hash and full key checked before anything is loaded), then the host
// compiler, whose output is published to the disk cache. Identical kernels have identical source
// and so one key: a stack of identical blocks compiles one block's kernels.
//
// The key covers everything baked into the object: the source (op structure, extents, element
// type, contiguity), the code generator's version, the compiler's identity and full flags, the
// CPU the code is built for (-march=native), and the fusebox version.
//
// Trust (DESIGN.md, "The cache is a trust boundary"): nothing compiled, included or loaded comes
// from a path another user can change. The host compiler refuses include directories and a
// temporary root that fail posix.hpp's rule (get_all then throws compile_failure with the reason:
// the call runs eagerly). The precompiled prelude is a disk-cache entry like a kernel (published
// atomically, its SHA-256 recorded and checked before use); the compiler reaches it through a
// fresh private directory (mkdtemp, 0700, owner checked, never reused by name) that holds
// fusebox/jit/prelude.hpp.gch, a symlink into the cache, or the file itself when there is no
// trusted cache. A damaged prelude (a bad entry at start-up, or a kernel compile failing because
// the file changed under us) is rebuilt once per process with one warning; a damaged kernel
// entry is removed and recompiled, with one warning.
// Depends on: runtime/{host_compiler,disk_cache,memory_cache,cache_key,shared_library,counters,logs,
// posix,hash}.hpp, backend/cpu/{codegen,generated_program}.hpp, version.hpp, POSIX (mkdir, read,
// stat, kill).
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "fusebox/backend/cpu/codegen.hpp"
#include "fusebox/backend/cpu/generated_program.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/pipeline/targets.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/hash.hpp"
#include "fusebox/runtime/host_compiler.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/memory_cache.hpp"
#include "fusebox/runtime/posix.hpp"
#include "fusebox/runtime/shared_library.hpp"
#include "fusebox/version.hpp"

namespace fusebox::jit {

/// Bumped whenever generated code changes meaning, so old cache entries stop matching.
inline constexpr int codegen_version = 4;  // 2: column kernels take output-row ranges; kernel_args::rank
                                           // 3: kernel_args::stream, read by rows kernels' output pass
                                           // 4: float exp from a table with AVX-512 (vmath.hpp): other
                                           //    bits than a kernel built before, which the static path
                                           //    must match

/// A generated kernel could not be compiled: the caller falls back to eager (or throws under
/// fullgraph); the source and the compiler's log are kept for the report.
struct compile_failure : fusebox::error {
  compile_failure(std::string what, std::string source_, std::string log_)
      : fusebox::error(std::move(what)), source(std::move(source_)), log(std::move(log_)) {}
  std::string source, log;
};

namespace detail {
/// The CPU the code is built for: model name and feature flags (-march=native bakes them in).
FUSEBOX_RUNTIME_API const std::string& cpu_identity();

struct loaded_kernel {
  std::shared_ptr<shared_library> shared;  // one object may hold several kernels
  void* fn = nullptr;
};
}  // namespace detail

class kernel_store {
 public:
  static kernel_store& instance();
  /// fusebox::reset() reaches the store through jit::clear_kernel_memory (pipeline/targets.hpp),
  /// set when the store is made: before that it holds nothing to clear. (Set at include time
  /// instead, it compiled the store into every unit that includes it; issue 22.)
  kernel_store();

  /// The compiled kernel for each of `rs`, loaded. Kernels found in neither cache are compiled
  /// together, in one run of the host compiler (one translation unit, one symbol per kernel),
  /// and the object is published under each kernel's key. Throws compile_failure (or
  /// compile_forbidden).
  std::vector<kernel_binary> get_all(const std::vector<rendered_kernel>& rs);

  /// Forgets the loaded kernels (objects stay loaded while programs use them).
  void clear_memory() { memory_.clear(); }
  disk_cache& disk() noexcept { return disk_; }
  const host_compiler& compiler() const noexcept { return *compiler_; }

  /// Replaces the compiler (and drops the precompiled prelude): for tests and for programs that
  /// want other flags than FUSEBOX_CXX / FUSEBOX_CXXFLAGS gave at start-up. Keys change with it.
  void use_compiler(host_compiler_options o);

  /// The .gch the kernel compiler uses now (in the disk cache, or in this process's private
  /// directory); empty when kernels compile without one. For tests and reports.
  std::filesystem::path prelude_file();

 private:
  using loaded_ptr = std::shared_ptr<const detail::loaded_kernel>;

  cache_key key_of(const rendered_kernel& r) const;
  static std::string symbol_of(const cache_key& key) {
    return std::string(kernel_symbol) + "_" + key.digest().substr(0, 24);
  }
  static loaded_ptr load(const std::filesystem::path& path, const std::string& symbol);
  loaded_ptr remember(const cache_key& key, loaded_ptr k);
  static kernel_binary binary(const loaded_ptr& k, const rendered_kernel& r);

  /// A precompiled prelude in use.
  struct prelude_pch {
    std::shared_ptr<temp_directory> dir;  // private; first on the kernel compiler's include path
    std::filesystem::path file;           // the .gch: a disk-cache entry's payload, or in `dir`
    std::string sha256;                   // of `file` when built here (a cache entry records its own)
    cache_key key;                        // its disk-cache key (headers as they were at start-up)
    bool in_cache = false;
    struct stat seen {};                  // `file` when last verified: a change means verify again
  };

  static bool same_file(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
           a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
  }

  /// True when the prelude `used` compiles with has changed on disk since it was verified (a
  /// stat, before each compile: a truncated or rewritten .gch is caught before the compiler
  /// trips over it). An unchanged content hash just records the new stat.
  bool pch_changed(const std::shared_ptr<const host_compiler>& used);

  /// The compiler with the precompiled prelude in front of the include path (built on first use;
  /// FUSEBOX_JIT_PCH=0 turns it off). The prelude is most of a kernel's compile time; with it a
  /// program's kernels compile in a fraction of a second. The key does not change: the code is the
  /// same, only the compiler's work is.
  std::shared_ptr<const host_compiler> compiler_for_kernels();

  void use_pch(std::optional<prelude_pch> p);

  /// Why the prelude in use no longer matches what was published or built, or nullopt.
  std::optional<std::string> pch_damage(const prelude_pch& p);

  /// When the prelude `used` has changed on disk, or a kernel compile with it failed: if it is
  /// damaged, rebuilds it (once per process, one warning; a second time, drops it) and returns
  /// true so the caller takes the compiler again. False when it is intact (an honest compile
  /// error).
  bool repair_pch(const std::shared_ptr<const host_compiler>& used);

  /// The disk-cache key of the precompiled prelude built by `c`: the compiler (path, version,
  /// flags) and the headers the prelude pulls in, so an edited header never meets a stale PCH.
  static cache_key prelude_key(const host_compiler& c);

  /// Hash of the headers the prelude pulls in, so an edited header never meets a stale PCH.
  static std::string prelude_digest(const std::filesystem::path& include);

  static std::string sha256_of_file(const std::filesystem::path& path);

  /// The prelude from the disk cache (checked like any entry), else built with the kernels' own
  /// flags into a fresh private directory and published to the cache. Nullopt (kernels compile
  /// without it) when it cannot be had; never throws.
  std::optional<prelude_pch> prepare_pch();

  /// Private prelude directories that processes of this user left behind when they died (killed,
  /// or _exit: no destructor ran): each holds the pid of its maker. Only ours (owner, 0700) go,
  /// and only when that process is gone.
  static void remove_stale_pch_directories();

  static void warn_once(std::atomic<bool>& said, const std::string& message) {
    if (!said.exchange(true)) warn(message);
  }

  std::shared_ptr<const host_compiler> compiler_ = std::make_shared<host_compiler>();
  std::once_flag pch_once_;
  std::shared_ptr<const host_compiler> pch_compiler_;  // compiler_'s flags with pch_ first
  std::optional<prelude_pch> pch_;
  std::mutex compiler_mutex_;  // compiler_, pch_compiler_, pch_
  std::mutex repair_mutex_;    // one repair at a time
  std::atomic<bool> pch_rebuilt_{false}, pch_warned_{false}, damaged_entry_warned_{false};
  disk_cache disk_;
  memory_cache<loaded_ptr> memory_;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {
FUSEBOX_RUNTIME_API const std::string& cpu_identity() {
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
}  // namespace detail

FUSEBOX_RUNTIME_API kernel_store& kernel_store::instance() {
  static kernel_store store;
  return store;
}

FUSEBOX_RUNTIME_API kernel_store::kernel_store() {
  clear_kernel_memory = [] { instance().clear_memory(); };
}

FUSEBOX_RUNTIME_API std::vector<kernel_binary> kernel_store::get_all(const std::vector<rendered_kernel>& rs) {
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
      const disk_lookup found = disk_.find(keys[i]);
      if (found.path) {
        try {
          out[i] = binary(remember(keys[i], load(*found.path, symbol_of(keys[i]))), rs[i]);
          profile::instant("kernel disk hit", "cache", rs[i].summary);
          continue;
        } catch (const load_error& e) {  // evicted by another process since the check: a miss
          log(log_category::cache, std::string("disk hit not loadable, compiling: ") + e.what());
        }
      } else if (found.status == disk_status::corrupt || found.status == disk_status::wrong_key) {
        warn_once(damaged_entry_warned_,
                  "fusebox: a damaged kernel in the disk cache was removed and is being recompiled (" +
                      disk_.entry_directory(keys[i]).string() + ": " + found.reason +
                      "). Later damaged entries are logged under FUSEBOX_LOGS=cache; if this recurs, "
                      "check the disk or who else writes to " + disk_.directory().string());
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
  std::shared_ptr<const host_compiler> compiler = compiler_for_kernels();
  if (pch_changed(compiler) && repair_pch(compiler)) compiler = compiler_for_kernels();
  if (const auto& why = compiler->untrusted_inputs())
    FUSEBOX_THROW(compile_failure("fusebox: the JIT will not compile: " + *why, {}, {}));
  compile_result built = compiler->compile(unit, "fusebox_kernels");
  if (!built.ok && repair_pch(compiler)) built = compiler_for_kernels()->compile(unit, "fusebox_kernels");
  if (!built.ok) FUSEBOX_THROW(compile_failure("fusebox: generated kernels failed to compile", unit, built.log));
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

FUSEBOX_RUNTIME_API void kernel_store::use_compiler(host_compiler_options o) {
  std::call_once(pch_once_, [] {});
  std::lock_guard lock(compiler_mutex_);
  compiler_ = std::make_shared<host_compiler>(std::move(o));
  pch_compiler_.reset();
  pch_.reset();
}

FUSEBOX_RUNTIME_API std::filesystem::path kernel_store::prelude_file() {
  compiler_for_kernels();
  std::lock_guard lock(compiler_mutex_);
  return pch_ ? pch_->file : std::filesystem::path();
}

FUSEBOX_RUNTIME_API cache_key kernel_store::key_of(const rendered_kernel& r) const {
  cache_key key;
  key.add("fusebox", version_string)
      .add("codegen", std::to_string(codegen_version))
      .add("compiler", compiler_->identity())
      .add("cpu", detail::cpu_identity())
      .add("fast_math", r.fast_math)  // the source says so too; the key never relies on that
      .add("source", r.source);
  return key;
}

FUSEBOX_RUNTIME_API kernel_store::loaded_ptr kernel_store::load(const std::filesystem::path& path,
                                                                const std::string& symbol) {
  auto k = std::make_shared<detail::loaded_kernel>();
  k->shared = std::make_shared<shared_library>(path);
  k->fn = k->shared->symbol(symbol.c_str());
  return k;
}

FUSEBOX_RUNTIME_API kernel_store::loaded_ptr kernel_store::remember(const cache_key& key, loaded_ptr k) {
  return memory_.get_or_create(key, [&] { return k; });
}

FUSEBOX_RUNTIME_API kernel_binary kernel_store::binary(const loaded_ptr& k, const rendered_kernel& r) {
  kernel_binary b;
  b.fn = k->fn;
  b.locals = r.locals;
  b.owner = k;
  b.summary = r.summary;
  return b;
}

FUSEBOX_RUNTIME_API bool kernel_store::pch_changed(const std::shared_ptr<const host_compiler>& used) {
  std::lock_guard lock(compiler_mutex_);
  if (!pch_ || used != pch_compiler_) return false;
  struct stat now {};
  return ::stat(pch_->file.c_str(), &now) != 0 || !same_file(now, pch_->seen);
}

FUSEBOX_RUNTIME_API std::shared_ptr<const host_compiler> kernel_store::compiler_for_kernels() {
  std::call_once(pch_once_, [this] {
    const char* env = std::getenv("FUSEBOX_JIT_PCH");
    if (env && std::string(env) == "0") return;
    if (compiler_->untrusted_inputs()) return;  // get_all refuses, with the reason
    use_pch(prepare_pch());
  });
  std::lock_guard lock(compiler_mutex_);
  return pch_compiler_ ? pch_compiler_ : compiler_;
}

FUSEBOX_RUNTIME_API void kernel_store::use_pch(std::optional<prelude_pch> p) {
  std::shared_ptr<host_compiler> c;
  if (p) {
    host_compiler_options o;
    o.flags = host_compiler::default_flags();
    o.flags.insert(o.flags.begin(), "-I" + p->dir->path().string());
    o.flags.push_back("-Winvalid-pch");
    c = std::make_shared<host_compiler>(o);
  }
  std::lock_guard lock(compiler_mutex_);
  pch_ = std::move(p);
  pch_compiler_ = std::move(c);
}

FUSEBOX_RUNTIME_API std::optional<std::string> kernel_store::pch_damage(const prelude_pch& p) {
  if (p.in_cache) {
    const disk_lookup found = disk_.find(p.key);  // removes a bad entry
    if (found.path && *found.path == p.file) return std::nullopt;
    return found.reason.empty() ? std::string("not in the disk cache any more") : found.reason;
  }
  try {
    if (sha256_of_file(p.file) == p.sha256) return std::nullopt;
    return std::string("content hash mismatch");
  } catch (const io_error& e) {
    return std::string(e.what());
  }
}

FUSEBOX_RUNTIME_API bool kernel_store::repair_pch(const std::shared_ptr<const host_compiler>& used) {
  std::lock_guard repair(repair_mutex_);
  std::optional<prelude_pch> current;
  {
    std::lock_guard lock(compiler_mutex_);
    if (used == compiler_) return false;      // no prelude was in use: an honest failure
    if (used != pch_compiler_) return true;   // another thread replaced it meanwhile: retry
    current = pch_;
  }
  auto why = pch_damage(*current);
  if (!why) {
    std::lock_guard lock(compiler_mutex_);
    if (pch_ && pch_->file == current->file) ::stat(current->file.c_str(), &pch_->seen);
    return false;
  }
  const bool first = !pch_rebuilt_.exchange(true);
  warn_once(pch_warned_, "fusebox: the precompiled kernel prelude '" + current->file.string() + "' is damaged (" +
                             *why + "); " + (first ? "rebuilding it" : "compiling without it from now on") +
                             ". If this recurs, check the disk or who else writes there");
  if (!first) {
    use_pch(std::nullopt);
    return true;
  }
  use_pch(std::nullopt);  // before building: this process never uses the damaged file again
  use_pch(prepare_pch());
  return true;
}

FUSEBOX_RUNTIME_API cache_key kernel_store::prelude_key(const host_compiler& c) {
  cache_key k;
  k.add("compiler", c.identity()).add("headers", prelude_digest(detail::fusebox_include_dir()));
  return k;
}

FUSEBOX_RUNTIME_API std::string kernel_store::prelude_digest(const std::filesystem::path& include) {
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

FUSEBOX_RUNTIME_API std::string kernel_store::sha256_of_file(const std::filesystem::path& path) {
  detail::unique_fd fd = detail::open_fd(path, O_RDONLY);
  if (!fd) detail::throw_io("cannot open", path);
  sha256 h;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) detail::throw_io("cannot read", path);
    if (n == 0) return hex(h.finish());
    h.update(buffer.data(), static_cast<std::size_t>(n));
  }
}

FUSEBOX_RUNTIME_API std::optional<kernel_store::prelude_pch> kernel_store::prepare_pch() {
  try {
    const std::filesystem::path include = detail::fusebox_include_dir();
    if (include.empty()) return std::nullopt;
    const cache_key key = prelude_key(*compiler_);
    prelude_pch p;
    p.key = key;
    remove_stale_pch_directories();
    // Removed when the last user goes, by the process that made it only (a forked child that
    // exits normally must not take its parent's prelude away).
    const pid_t creator = ::getpid();
    p.dir = std::shared_ptr<temp_directory>(new temp_directory(detail::temp_root(), "fusebox-pch-"),
                                            [creator](temp_directory* d) {
                                              if (::getpid() != creator) d->release();
                                              delete d;
                                            });
    detail::write_new_file(p.dir->path() / "pid", std::to_string(creator));
    const auto jit_dir = p.dir->path() / "fusebox" / "jit";
    for (const auto& d : {p.dir->path() / "fusebox", jit_dir})
      if (::mkdir(d.c_str(), 0700) != 0) detail::throw_io("cannot create directory", d);
    const auto gch = jit_dir / "prelude.hpp.gch";
    if (disk_.enabled()) {
      // stat before the content check: a change after it shows at the next compile.
      ::stat((disk_.entry_directory(key) / "artifact.so").c_str(), &p.seen);
      const disk_lookup found = disk_.find(key);
      if (found.path) {
        std::filesystem::create_symlink(*found.path, gch);
        p.file = *found.path;
        p.in_cache = true;
        return p;
      }
      if (found.status == disk_status::corrupt || found.status == disk_status::wrong_key)
        warn_once(pch_warned_, "fusebox: the precompiled kernel prelude in the disk cache was damaged (" +
                                   disk_.entry_directory(key).string() + ": " + found.reason +
                                   "); rebuilding it. If this recurs, check the disk or who else writes to " +
                                   disk_.directory().string());
    }
    std::vector<std::string> argv{compiler_->compiler()};
    for (const auto& f : compiler_->flags())
      if (f != "-shared") argv.push_back(f);
    argv.insert(argv.end(), {"-x", "c++-header", (include / "fusebox" / "jit" / "prelude.hpp").string(), "-o",
                             gch.string()});
    const auto prelude_span = profile::prelude_build_span(gch.string());  // its own span in the trace
    const auto start = std::chrono::steady_clock::now();
    const auto log_file = p.dir->path() / "log.txt";
    const auto run = detail::run_process(argv, log_file, p.dir->path(), 600);
    std::error_code ec;
    if (!run.exited || run.status != 0 || !std::filesystem::is_regular_file(gch, ec)) {
      std::string text;
      try {
        text = detail::read_file(log_file, 1 << 16);
      } catch (const io_error&) {
      }
      log(log_category::kernels, "precompiling the kernel prelude failed (" + run.error + "):\n" + text);
      return std::nullopt;
    }
    std::filesystem::remove(log_file, ec);
    p.file = gch;
    ::stat(gch.c_str(), &p.seen);
    p.sha256 = sha256_of_file(gch);
    if (disk_.enabled())
      if (const auto stored = disk_.store(key, gch)) {
        // Use the published copy (one file on disk, not one per process).
        std::filesystem::remove(gch);
        std::filesystem::create_symlink(*stored, gch);
        p.file = *stored;
        p.in_cache = true;
        ::stat(p.file.c_str(), &p.seen);  // written from the bytes hashed above, then checked on a change
      }
    log(log_category::kernels,
        "precompiled the kernel prelude in " +
            std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()) +
            " s: " + p.file.string());
    return p;
  } catch (const std::exception& e) {
    warn(std::string("fusebox: precompiled prelude unavailable (") + e.what() + "); compiling without it");
    return std::nullopt;
  }
}

FUSEBOX_RUNTIME_API void kernel_store::remove_stale_pch_directories() {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(detail::temp_root(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path dir = it->path();
    if (dir.filename().string().rfind("fusebox-pch-", 0) != 0) continue;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (st.st_mode & 07777) != 0700)
      continue;
    long pid = 0;
    try {
      pid = std::stol(detail::read_file(dir / "pid", 32));
    } catch (const std::exception&) {
      continue;  // being set up, or not one of ours
    }
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
}
#endif

}  // namespace fusebox::jit
