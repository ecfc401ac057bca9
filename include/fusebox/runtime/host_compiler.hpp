// fusebox/runtime/host_compiler.hpp: compiles generated C++ (the CPU JIT's kernels) into a shared
// object with the host C++ compiler.
//
// Which compiler: host_compiler_options::compiler, else FUSEBOX_CXX, else the compiler that
// built this program where a macro says so (FUSEBOX_HOST_CXX if the build defines it, else
// g++ for GCC and clang++ for Clang), else `c++`. Flags: `-O3 -march=native -std=c++20 -fPIC
// -shared` unless replaced, then FUSEBOX_CXXFLAGS (split at whitespace; no quoting), then
// extra_flags, then -I for the fusebox headers (FUSEBOX_INCLUDE_DIR, else the include/ directory
// this header was found in at build time) and for each extra include directory.
//
// How (DESIGN.md, "The cache is a trust boundary"): the compiler is started with an argument
// vector through posix_spawnp, never through a shell, so no path or flag is ever re-parsed; it
// runs in a private directory (mkdtemp, 0700, also its TMPDIR) that holds the source, the log and
// the output. The directory lives as long as the compile_result (so the caller can copy the .so
// into the disk cache or dlopen it) and is removed with it.
//
// Result: {ok, path to the .so, the compiler's full output, seconds, the command}. A failed
// compile is not an exception: ok is false and the log says why, so the caller can fall back to
// eager and keep the source for the report. Exceptions are for the caller's contract only:
// compile_forbidden (counters.hpp test switch) and io_error when no temporary directory can be
// made.
//
// identity() is what a cache key needs to know about this compiler: its resolved path, the
// first line of `--version`, and the full flag list (computed once per object).
//
// Trust (posix.hpp's rule): every directory the flags put on the include path (-I, -isystem,
// -iquote, -idirafter), every file they -include, the tree under each, and the temporary root the
// compiler runs in must be unchangeable by users other than root and the current one: a header
// someone else can edit is code they run in this process. untrusted_inputs() says why not
// (checked once per object); compile() then refuses (ok = false, the reason in the log) without
// starting the compiler. The compiler's own system directories are the compiler's business.
//
// Depends on: the C++20 standard library, POSIX (posix_spawnp, waitpid, mkdtemp), and
// fusebox/runtime/{posix,counters,logs}.hpp, fusebox/profile.hpp.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fusebox/core/linkage.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/posix.hpp"

extern char** environ;  // POSIX: the process environment, passed on to the compiler

namespace fusebox::jit {

struct host_compiler_options {
  /// Empty: FUSEBOX_CXX, else the compiler that built this program, else "c++".
  std::string compiler;
  /// Empty: host_compiler::default_flags().
  std::vector<std::string> flags;
  /// Appended after the flags and FUSEBOX_CXXFLAGS.
  std::vector<std::string> extra_flags;
  /// Searched after the fusebox include directory.
  std::vector<std::filesystem::path> include_dirs;
  /// Empty: FUSEBOX_INCLUDE_DIR, else derived from this header's location at build time.
  std::filesystem::path fusebox_include_dir;
  /// A compiler running longer is killed (and the compile fails). 0: no limit.
  double timeout_seconds = 600;
};

struct compile_result {
  bool ok = false;
  std::filesystem::path library;  // the shared object, valid while this result lives
  std::string log;                // everything the compiler printed, plus fusebox's notes
  double seconds = 0;
  std::vector<std::string> command;            // the argument vector, for reports
  std::shared_ptr<temp_directory> directory;   // owns `library`; removed with the last copy
};

namespace detail {

/// The compiler that built this translation unit, as a command name.
inline std::string build_compiler() {
#if defined(FUSEBOX_HOST_CXX)
  return FUSEBOX_HOST_CXX;
#elif defined(__clang__)
  return "clang++";
#elif defined(__GNUC__)
  return "g++";
#else
  return "c++";
#endif
}

/// `name` resolved through PATH as execvp would, or nullopt.
FUSEBOX_RUNTIME_API std::optional<std::filesystem::path> find_program(const std::string& name);

/// The fusebox include directory: FUSEBOX_INCLUDE_DIR, else the one holding this header.
FUSEBOX_RUNTIME_API std::filesystem::path fusebox_include_dir();

FUSEBOX_RUNTIME_API std::vector<std::string> split_whitespace(std::string_view text);

struct process_result {
  bool started = false;
  bool exited = false;      // normal exit (then `status` is the exit code)
  int status = -1;
  bool timed_out = false;
  std::string error;        // why it did not start, or how it ended abnormally
};

/// Runs argv[0] (found through PATH) with `argv`, stdin from /dev/null, stdout and stderr into
/// the file `output`, in `cwd`, with TMPDIR=`cwd`. No shell is involved.
FUSEBOX_RUNTIME_API process_result run_process(const std::vector<std::string>& argv,
                                               const std::filesystem::path& output,
                                               const std::filesystem::path& cwd, double timeout_seconds);

/// Letters, digits, '_' and '-' only: the name becomes a file name.
FUSEBOX_RUNTIME_API std::string file_stem(std::string_view name);

}  // namespace detail

class host_compiler {
 public:
  explicit host_compiler(host_compiler_options options = {});

  static std::vector<std::string> default_flags() {
    return {"-O3", "-march=native", "-std=c++20", "-fPIC", "-shared"};
  }

  /// The compiler command as configured (a name looked up in PATH, or a path).
  const std::string& compiler() const noexcept { return compiler_; }
  /// Every flag passed, in order, without the source and output paths.
  const std::vector<std::string>& flags() const noexcept { return flags_; }

  /// "compiler <path>\nversion <first line of --version>\nflags <n>:<flag> ..." — everything
  /// about this compiler that changes the code it produces, for cache keys. Computed once.
  const std::string& identity() const {
    std::call_once(identity_once_, [this] { identity_ = compute_identity(); });
    return identity_;
  }

  /// Why this compiler must not run (an include directory, an included file or the temporary
  /// root that another user can change), or nullopt. Checked once; see "Trust" above.
  const std::optional<std::string>& untrusted_inputs() const {
    std::call_once(trust_once_, [this] { untrusted_ = check_inputs(); });
    return untrusted_;
  }

  /// Compiles `source` into a shared object. `name` (sanitised) names the files, for logs.
  compile_result compile(std::string_view source, std::string_view name = "kernel") const;

 private:
  std::optional<std::string> check_inputs() const;

  std::string compute_identity() const;

  host_compiler_options options_;
  std::string compiler_;
  std::vector<std::string> flags_;
  mutable std::once_flag identity_once_;
  mutable std::string identity_;
  mutable std::once_flag trust_once_;
  mutable std::optional<std::string> untrusted_;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {

FUSEBOX_RUNTIME_API std::optional<std::filesystem::path> find_program(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    std::error_code ec;
    return std::filesystem::absolute(name, ec);
  }
  const char* env = std::getenv("PATH");
  std::string_view path = env ? env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = path.find(':');
    std::string dir(path.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::filesystem::path candidate = std::filesystem::path(dir) / name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    path.remove_prefix(colon + 1);
  }
}

FUSEBOX_RUNTIME_API std::filesystem::path fusebox_include_dir() {
  if (const char* env = std::getenv("FUSEBOX_INCLUDE_DIR"); env && *env) return env;
  // This file is <include>/fusebox/runtime/host_compiler.hpp.
  std::error_code ec;
  const auto dir = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  if (std::filesystem::exists(dir / "fusebox" / "runtime" / "host_compiler.hpp", ec))
    return std::filesystem::absolute(dir, ec);
  return {};  // __FILE__ was relative to a build directory we cannot see from here
}

FUSEBOX_RUNTIME_API std::vector<std::string> split_whitespace(std::string_view text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) ++i;
    const std::size_t start = i;
    while (i < text.size() && !(text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) ++i;
    if (i > start) out.emplace_back(text.substr(start, i - start));
  }
  return out;
}

FUSEBOX_RUNTIME_API process_result run_process(const std::vector<std::string>& argv,
                                               const std::filesystem::path& output,
                                               const std::filesystem::path& cwd, double timeout_seconds) {
  process_result result;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // The environment, with TMPDIR pointing into our private directory.
  const std::string tmpdir = "TMPDIR=" + cwd.string();
  std::vector<char*> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "TMPDIR=", 7) != 0) env.push_back(*e);
  env.push_back(const_cast<char*>(tmpdir.c_str()));
  env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attributes);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
  ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 29))
  ::posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
#endif
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // The compiler gets stdin, stdout and stderr only, not this process's other descriptors
  // (sockets, cache files) that lack O_CLOEXEC.
  ::posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
  // The child starts with no blocked signals and default dispositions, whatever this process
  // (a server with signal-handling threads) has set up.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attributes, &none);
  ::posix_spawnattr_setsigdefault(&attributes, &all);
  ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), env.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  if (rc != 0) {
    result.error = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    return result;
  }
  result.started = true;

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_seconds > 0 ? timeout_seconds : 0);
  auto nap = std::chrono::microseconds(500);
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, timeout_seconds > 0 ? WNOHANG : 0);
    if (done == pid) break;
    if (done < 0) {
      if (errno == EINTR) continue;
      result.error = std::string("cannot wait for the compiler: ") + std::strerror(errno) +
                     (errno == ECHILD ? " (is SIGCHLD ignored in this process?)" : "");
      return result;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      result.error = "killed after " + std::to_string(timeout_seconds) + " s (timeout_seconds)";
      return result;
    }
    std::this_thread::sleep_for(nap);  // a compile takes 0.1-10 s; 10 ms granularity is noise
    nap = std::min(nap * 2, std::chrono::microseconds(10000));
  }
  if (WIFEXITED(status)) {
    result.exited = true;
    result.status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.error = "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                   strsignal(WTERMSIG(status)) + ")";
  }
  return result;
}

FUSEBOX_RUNTIME_API std::string file_stem(std::string_view name) {
  std::string out;
  for (const char c : name)
    out.push_back((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          c == '_' || c == '-'
                      ? c
                      : '_');
  if (out.empty()) out = "kernel";
  if (out.size() > 64) out.resize(64);
  return out;
}

}  // namespace detail

FUSEBOX_RUNTIME_API host_compiler::host_compiler(host_compiler_options options) : options_(std::move(options)) {
  compiler_ = options_.compiler;
  if (compiler_.empty()) {
    const char* env = std::getenv("FUSEBOX_CXX");
    compiler_ = env && *env ? env : detail::build_compiler();
  }
  flags_ = options_.flags.empty() ? default_flags() : options_.flags;
  if (const char* env = std::getenv("FUSEBOX_CXXFLAGS"))
    for (auto& f : detail::split_whitespace(env)) flags_.push_back(std::move(f));
  flags_.insert(flags_.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  std::filesystem::path fusebox_include = options_.fusebox_include_dir;
  if (fusebox_include.empty()) fusebox_include = detail::fusebox_include_dir();
  if (fusebox_include.empty())
    warn("host compiler: the fusebox include directory is unknown (set FUSEBOX_INCLUDE_DIR); "
         "generated kernels that include fusebox headers will not compile");
  else
    flags_.push_back("-I" + fusebox_include.string());
  for (const auto& dir : options_.include_dirs) flags_.push_back("-I" + dir.string());
  // xsimd outside the system include path (recorded by fusebox's CMake at configure time), and
  // anything FUSEBOX_JIT_INCLUDE (':'-separated) names: generated kernels include xsimd.
#if defined(FUSEBOX_JIT_XSIMD_INCLUDE)
  flags_.push_back(std::string("-I") + FUSEBOX_JIT_XSIMD_INCLUDE);
#endif
  if (const char* env = std::getenv("FUSEBOX_JIT_INCLUDE"))
    for (std::string_view rest = env; !rest.empty();) {
      const auto colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) flags_.push_back("-I" + std::string(dir));
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    }
}

FUSEBOX_RUNTIME_API compile_result host_compiler::compile(std::string_view source, std::string_view name) const {
  check_compile_allowed("'" + std::string(name) + "' (" + std::to_string(source.size()) +
                        " bytes of C++)");
  compile_result result;
  if (const auto& why = untrusted_inputs()) {
    result.log = "fusebox: refused to run the compiler: " + *why + "\n";
    return result;
  }
  profile::scoped_span span("host compile", "compile", name);
  const auto start = std::chrono::steady_clock::now();

  result.directory = std::make_shared<temp_directory>(detail::temp_root(), "fusebox-jit-");
  const auto& dir = result.directory->path();
  const std::string stem = detail::file_stem(name);
  const auto source_path = dir / (stem + ".cpp");
  const auto library_path = dir / (stem + ".so");
  const auto log_path = dir / (stem + ".log");
  detail::write_new_file(source_path, source);

  result.command.push_back(compiler_);
  result.command.insert(result.command.end(), flags_.begin(), flags_.end());
  result.command.insert(result.command.end(),
                        {"-o", library_path.string(), source_path.string()});

  const detail::process_result run =
      detail::run_process(result.command, log_path, dir, options_.timeout_seconds);
  try {
    result.log = detail::read_file(log_path, std::size_t{16} << 20);
  } catch (const io_error& e) {
    if (run.started) result.log = std::string("fusebox: cannot read the compiler log: ") + e.what() + "\n";
  }
  if (!run.error.empty()) result.log += "fusebox: " + run.error + "\n";
  std::error_code ec;
  result.ok = run.exited && run.status == 0 &&
              std::filesystem::is_regular_file(library_path, ec);
  if (run.exited && run.status != 0)
    result.log += "fusebox: the compiler exited with status " + std::to_string(run.status) + "\n";
  else if (run.exited && !result.ok)
    result.log += "fusebox: the compiler succeeded but wrote no '" + library_path.string() + "'\n";
  if (result.ok) result.library = library_path;
  std::filesystem::remove(source_path, ec);  // the caller holds the source; keep only the .so

  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto& c = counters();
  c.compiles.fetch_add(1, std::memory_order_relaxed);
  c.add_compile_seconds(result.seconds);
  if (!result.ok) c.compile_failures.fetch_add(1, std::memory_order_relaxed);
  span.note(result.ok ? "ok" : "failed");
  if (enabled(log_category::kernels)) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f", result.seconds);
    log(log_category::kernels, "host compile '" + stem + "': " +
                                   (result.ok ? "ok" : "FAILED") + " in " + seconds + " s");
  }
  return result;
}

FUSEBOX_RUNTIME_API std::optional<std::string> host_compiler::check_inputs() const {
  const std::filesystem::path temp = detail::temp_root();
  if (auto why = detail::untrusted_directory(temp, /*sticky_leaf=*/true))
    return "the temporary directory '" + temp.string() + "' (TMPDIR) is not safe: " + *why +
           ". Fix: set TMPDIR to a directory only you (or root) can write, or unset it for /tmp";
  const auto refuse = [](const std::string& flag, const std::string& why) {
    return "the include path '" + flag + "' is not safe: " + why +
           ". Anyone who can change what it holds could put code into every kernel this process "
           "loads. Fix: make it (and each directory above it) owned by root or you and not "
           "writable by group or others, or point FUSEBOX_INCLUDE_DIR / FUSEBOX_JIT_INCLUDE / "
           "FUSEBOX_CXXFLAGS at a copy that is";
  };
  for (std::size_t i = 0; i < flags_.size(); ++i) {
    const std::string& f = flags_[i];
    for (const std::string_view option : {"-I", "-isystem", "-iquote", "-idirafter", "-include"}) {
      if (f.rfind(option, 0) != 0) continue;
      std::string path = f.substr(option.size());
      if (path.empty() && i + 1 < flags_.size()) path = flags_[i + 1];
      if (path.empty()) break;
      if (option == "-include") {
        std::error_code ec;
        const std::filesystem::path file = std::filesystem::canonical(path, ec);
        if (ec) break;  // the compiler will say it is missing
        struct stat st {};
        std::optional<std::string> why = detail::untrusted_directory(file.parent_path());
        if (!why && ::stat(file.c_str(), &st) == 0) why = detail::foreign_writable(file, st, false);
        if (why) return refuse(f, *why);
      } else if (std::error_code ec; std::filesystem::exists(path, ec)) {  // a missing one holds nothing
        if (auto why = detail::untrusted_tree(path)) return refuse(f, *why);
      }
      break;
    }
  }
  return std::nullopt;
}

FUSEBOX_RUNTIME_API std::string host_compiler::compute_identity() const {
  const auto resolved = detail::find_program(compiler_);
  std::string version = "unknown";
  try {
    temp_directory dir(detail::temp_root(), "fusebox-cxx-");
    const auto out = dir.path() / "version.txt";
    const auto run = detail::run_process({compiler_, "--version"}, out, dir.path(), 60);
    if (run.exited && run.status == 0) {
      const std::string text = detail::read_file(out, 1 << 20);
      version = text.substr(0, text.find('\n'));
    } else {
      version = "unknown (" + (run.error.empty() ? "exit status " + std::to_string(run.status)
                                                 : run.error) + ")";
    }
  } catch (const std::exception& e) {
    version = std::string("unknown (") + e.what() + ")";
  }
  std::string id = "compiler " + (resolved ? resolved->string() : compiler_) + "\nversion " +
                   version + "\nflags";
  // Length-prefixed, so a flag holding a space cannot pass for two flags.
  for (const auto& f : flags_) id += " " + std::to_string(f.size()) + ":" + f;
  return id;
}
#endif

}  // namespace fusebox::jit
