// The run-time path's trust boundary against a hostile machine (issue 20): runtime/kernel_store.hpp,
// disk_cache.hpp, host_compiler.hpp and posix.hpp together, through the public compile().
//
// Every case runs the model in fresh processes (this binary re-executed as a hidden "worker"
// test case, the kernel store's state is per process) and checks four things: no code that
// fusebox did not compile itself ran (planted headers and shared objects carry a constructor
// that writes a marker file: it must never appear), the results match a double reference on
// random inputs, the process warned exactly as often as the case calls for (once, or not at all),
// and the next process is clean. The cases: names planted in the temp directory; include
// directories and temp roots other users can write; cache directories that are 0777, 0755,
// another user's, symlinked or read-only; every cache file truncated, emptied, overwritten or
// replaced by a symlink; a damaged precompiled prelude, at start-up and mid-run; two processes
// compiling the same kernels at once; a full disk (a small tmpfs; skipped with a message where
// mount(2) is not allowed). Tests that need a second user (chown to nobody) or mounts need
// root, as CI has; elsewhere they say so and skip.
//
// Cost: one model (exp(x) * y + x, one kernel) compiled at -O1 against a snapshot of the headers;
// the precompiled prelude is built five times (two concurrently), each other worker compiles one
// kernel or none.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;
namespace fs = std::filesystem;
namespace jit = fusebox::jit;

namespace {

constexpr uid_t nobody = 65534;

auto model = [](auto x, auto y) { return fb::exp(x) * y + x; };
using X = fb::tensor<float, fb::shape<fb::dyn, 16>>;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes, mode_t mode = 0644) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
    REQUIRE(out.good());
  }
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

/// Runs `x` through the compiled model and checks every element against a double reference.
void run_and_check(decltype(fb::compile(model))& fast, std::size_t batch, std::uint64_t seed) {
  X x(batch), y(batch);
  x.fill_random(seed, -2.0f, 2.0f);
  y.fill_random(seed + 1, -1.0f, 1.0f);
  const auto z = fast(x, y);
  REQUIRE(z.size() == x.size());
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double a = x.flat(i), b = y.flat(i);
    const double ref = std::exp(a) * b + a;
    INFO("element " << i << ": x " << a << ", y " << b);
    REQUIRE(std::abs(z.flat(i) - ref) <= 2e-6 * (1 + std::abs(ref)));
  }
}

}  // namespace

// --- the worker: one fresh process ----------------------------------------------------------

// Environment: FBT_REPORT (file for the counters), FBT_BATCH (the batch size: a new one is a new
// kernel), FBT_SEED, FBT_DAMAGE_MIDWAY=1 (truncate the prelude in use, then compile another
// kernel). Everything else (FUSEBOX_CACHE_DIR, TMPDIR, ...) is the case's.
TEST_CASE("hostile_cache worker", "[.hostile_worker]") {
  const std::string report = env_or("FBT_REPORT", "");
  REQUIRE(!report.empty());
  const std::size_t batch = std::stoul(env_or("FBT_BATCH", "3"));
  const std::uint64_t seed = std::stoull(env_or("FBT_SEED", "1"));
  auto fast = fb::compile(model);
  run_and_check(fast, batch, seed);
  std::string prelude = jit::kernel_store::instance().prelude_file().string();
  if (env_or("FBT_DAMAGE_MIDWAY", "0") == "1") {
    REQUIRE(!prelude.empty());
    REQUIRE(::truncate(prelude.c_str(), 4096) == 0);  // as a person or a full disk might
    auto again = fb::compile(model);
    run_and_check(again, batch + 1, seed + 2);
    prelude = jit::kernel_store::instance().prelude_file().string();
  }
  const auto c = jit::counters().snapshot();
  std::ofstream out(report);
  out << "compiles " << c.compiles << "\nkernels_compiled " << c.kernels_compiled << "\ncompile_failures "
      << c.compile_failures << "\ndisk_hits " << c.disk_hits << "\nprelude " << prelude << "\n";
}

namespace {

/// What a worker did.
struct worker_result {
  int status = -1;
  std::string out, err;
  std::map<std::string, std::string> report;

  std::string text(const std::string& key) const {
    const auto it = report.find(key);
    return it == report.end() ? std::string() : it->second;
  }
  long number(const std::string& key) const {
    const auto it = report.find(key);
    return it == report.end() ? -1 : std::stol(it->second);
  }
  int warnings() const {
    int n = 0;
    for (std::size_t at = err.find("[fusebox] warning:"); at != std::string::npos;
         at = err.find("[fusebox] warning:", at + 1))
      ++n;
    return n;
  }
};

using env_list = std::vector<std::pair<std::string, std::optional<std::string>>>;

struct running_worker {
  pid_t pid;
  fs::path files;
};

/// The shared scratch space: a temp root others may write (sticky, like /tmp), the marker the
/// planted code writes, a planted shared object, and a warm cache built once.
class suite {
 public:
  static suite& get() {
    static suite s;
    return s;
  }

  const fs::path& root() const { return root_.path(); }
  fs::path tmp() const { return root() / "tmp"; }
  fs::path marker() const { return root() / "PLANTED-CODE-RAN"; }
  const fs::path& planted_so() const { return planted_so_; }
  std::string planted_header() const {
    return "#pragma once\n#include <cstdio>\n__attribute__((constructor)) static void fbt_planted_header() {\n"
           "  if (std::FILE* f = std::fopen(\"" + marker().string() + "\", \"a\")) { std::fputs(\"header\\n\", f); "
           "std::fclose(f); }\n}\n#include \"" + (jit::detail::fusebox_include_dir() / "fusebox/jit/prelude.hpp").string() +
           "\"\n";
  }
  bool marker_appeared() const { return fs::exists(marker()); }

  /// A batch size no earlier worker used: its kernel is in no cache yet.
  std::size_t fresh_batch() { return next_batch_++; }

  /// The digest naming the precompiled prelude's cache entry, as the workers built it (taken
  /// from them, not recomputed here: the key hashes the headers, which may change meanwhile).
  std::string prelude_digest() { return prelude_entry().filename().string(); }

  running_worker start(const env_list& env, std::size_t batch) {
    const fs::path files = root() / ("worker-" + std::to_string(workers_++));
    fs::create_directories(files);
    std::random_device rd;
    const std::uint64_t seed = (std::uint64_t{rd()} << 20) ^ rd();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (const char* name : {"FUSEBOX_LOGS", "FUSEBOX_JIT_PCH", "FUSEBOX_JIT_INCLUDE", "FUSEBOX_INCLUDE_DIR",
                               "FUSEBOX_CACHE_MAX_BYTES", "FUSEBOX_DISABLE", "FUSEBOX_CXX", "FBT_DAMAGE_MIDWAY"})
        ::unsetenv(name);
      ::setenv("FUSEBOX_CXXFLAGS", "-O1", 1);
      ::setenv("FUSEBOX_INCLUDE_DIR", (root() / "include").c_str(), 1);
      ::setenv("FUSEBOX_CACHE_DIR", (root() / "warm").c_str(), 1);
      ::setenv("TMPDIR", tmp().c_str(), 1);
      ::setenv("FBT_REPORT", (files / "report").c_str(), 1);
      ::setenv("FBT_BATCH", std::to_string(batch).c_str(), 1);
      ::setenv("FBT_SEED", std::to_string(seed).c_str(), 1);
      for (const auto& [name, value] : env) {
        if (value)
          ::setenv(name.c_str(), value->c_str(), 1);
        else
          ::unsetenv(name.c_str());
      }
      const int out = ::open((files / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      const int err = ::open((files / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(120);
      ::execl("/proc/self/exe", "fusebox_test_jit_hostile_cache", "hostile_cache worker", static_cast<char*>(nullptr));
      ::_exit(121);
    }
    return {pid, files};
  }

  worker_result finish(const running_worker& w) {
    int status = 0;
    REQUIRE(::waitpid(w.pid, &status, 0) == w.pid);
    worker_result r;
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = slurp(w.files / "stdout");
    r.err = slurp(w.files / "stderr");
    std::ifstream in(w.files / "report");
    for (std::string key, value; in >> key && std::getline(in >> std::ws, value);) r.report[key] = value;
    return r;
  }

  worker_result run(const env_list& env, std::size_t batch) { return finish(start(env, batch)); }

  /// The warm cache (<root>/warm, 0700): the prelude and batch 3's kernel, built by two processes
  /// at once the first time.
  const fs::path& warm() {
    if (warm_.empty()) {
      auto a = start({}, warm_batch), b = start({}, warm_batch);
      const worker_result ra = finish(a), rb = finish(b);
      for (const auto* r : {&ra, &rb}) {
        INFO("stdout:\n" << r->out << "\nstderr:\n" << r->err);
        REQUIRE(r->status == 0);
        REQUIRE(r->warnings() == 0);
        REQUIRE(r->number("kernels_compiled") <= 1);
      }
      REQUIRE(ra.number("kernels_compiled") + rb.number("kernels_compiled") >= 1);
      warm_ = root() / "warm";
      prelude_entry_ = fs::path(ra.text("prelude")).parent_path();
      REQUIRE(prelude_entry_.parent_path() == warm_ / "v1" / "artifacts");
      REQUIRE(rb.text("prelude") == ra.text("prelude"));  // one entry, whoever published it
    }
    return warm_;
  }
  const fs::path& prelude_entry() {
    warm();
    return prelude_entry_;
  }
  static constexpr std::size_t warm_batch = 3;

  /// Every kernel entry of the warm cache (not the prelude's).
  std::vector<fs::path> kernel_entries() {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(warm() / "v1" / "artifacts"))
      if (e.path() != prelude_entry()) out.push_back(e.path());
    return out;
  }

  ~suite() {
    for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
  }

  /// mount -t tmpfs; false (and nothing mounted) where this process may not.
  bool mount_tmpfs(const fs::path& at, const std::string& options) {
    fs::create_directories(at);
    if (::mount("tmpfs", at.c_str(), "tmpfs", 0, options.c_str()) != 0) return false;
    mounts_.push_back(at);
    return true;
  }

 private:
  suite() {
    REQUIRE(::chmod(root().c_str(), 0755) == 0);  // others may look in (the plants are theirs)
    fs::create_directories(tmp());
    REQUIRE(::chmod(tmp().c_str(), 01777) == 0);
    // The workers' kernels include a snapshot of the headers: the prelude's key hashes them, and
    // in a shared checkout someone may edit one while this runs.
    fs::create_directories(root() / "include");
    fs::copy(jit::detail::fusebox_include_dir() / "fusebox", root() / "include" / "fusebox", fs::copy_options::recursive);
    // A shared object with a constructor: loading it at all is the failure.
    jit::host_compiler_options quick;
    quick.flags = {"-O0", "-std=c++20", "-fPIC", "-shared"};
    const jit::host_compiler cxx(quick);
    const auto built = cxx.compile(
        "#include <cstdio>\n__attribute__((constructor)) static void fbt_planted_so() {\n"
        "  if (std::FILE* f = std::fopen(\"" + marker().string() + "\", \"a\")) { std::fputs(\"so\\n\", f); "
        "std::fclose(f); }\n}\nextern \"C\" void fusebox_kernel() {}\n",
        "planted");
    REQUIRE(built.ok);
    planted_so_ = root() / "planted.so";
    fs::copy_file(built.library, planted_so_);
  }

  jit::temp_directory root_{jit::detail::temp_root(), "fusebox-hostile-"};
  fs::path planted_so_, warm_, prelude_entry_;
  std::size_t next_batch_ = 4;
  int workers_ = 0;
  std::vector<fs::path> mounts_;
};

/// chown -R (not following symlinks).
void give_to(const fs::path& path, uid_t uid) {
  REQUIRE(::lchown(path.c_str(), uid, uid) == 0);
  if (fs::is_directory(fs::symlink_status(path)))
    for (const auto& e : fs::recursive_directory_iterator(path))
      REQUIRE(::lchown(e.path().c_str(), uid, uid) == 0);
}

/// Runs `fn` in a child process as `uid` (fork, setgid, setuid): files it makes are that user's.
template <class Fn>
void as_user(uid_t uid, Fn fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(2);
    ::umask(0);
    try {
      fn();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

bool need_root(const char* what) {
  if (::geteuid() == 0) return true;
  WARN("skipped (needs root to act as another user or to mount): " << what);
  return false;
}

/// The checks every case makes of a worker: it passed (results right), no planted code ran, and
/// it warned `warnings` times.
void check_worker(const worker_result& r, int warnings, const std::string& about = {}) {
  INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  CHECK(r.status == 0);
  CHECK_FALSE(suite::get().marker_appeared());
  CHECK(r.warnings() == warnings);
  if (!about.empty()) CHECK(r.err.find(about) != std::string::npos);
}

/// A copy of `entry` (a cache entry directory) whose payload is the planted object, with meta
/// rewritten to match: it would pass every content check.
void plant_entry(const fs::path& entry, const fs::path& into) {
  fs::create_directories(into);
  const std::string so = slurp(suite::get().planted_so());
  write_file(into / "key", slurp(entry / "key"));
  write_file(into / "artifact.so", so, 0755);
  write_file(into / "meta", "fusebox-cache-entry 1\nkind artifact\nsize " + std::to_string(so.size()) + "\nsha256 " +
                                jit::sha256_hex(so) + "\n");
}

}  // namespace

// --- cases ------------------------------------------------------------------------------------

TEST_CASE("hostile_cache: two cold processes at once publish one prelude and one kernel and the next compiles nothing",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  const fs::path warm = s.warm();  // two workers at once, checked there
  CHECK(fs::is_regular_file(s.prelude_entry() / "artifact.so"));
  CHECK(s.kernel_entries().size() == 1);
  CHECK(fs::is_empty(warm / "v1" / "tmp"));
  const auto r = s.run({}, suite::warm_batch);
  check_worker(r, 0);
  CHECK(r.number("compiles") == 0);
  CHECK(r.number("kernels_compiled") == 0);
  // The private directories of every worker so far are gone with them; the temp root is empty.
  CHECK(fs::is_empty(s.tmp()));
}

TEST_CASE("hostile_cache: names planted in the temp directory and a refused cache never reach the compiler",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  if (!need_root("plant as another user")) return;
  s.warm();
  // Another user (nobody) plants, in the temp root, every name fusebox uses or used there: the
  // old predictable prelude directory, and mkdtemp-style names, each with a prelude.hpp that runs
  // code, a junk .gch beside it (so a compiler given this directory uses the header) and an object.
  const std::string old_name = "pch-" + s.prelude_digest().substr(0, 24);
  const std::vector<std::string> names{old_name,        "fusebox-pch-AAAAAA", "fusebox-jit-AAAAAA",
                                       "fusebox-cxx-AAAAAA", "pch-staging-AAAAAA", "fusebox-AAAAAA"};
  const std::string header = s.planted_header(), so = slurp(s.planted_so());
  const fs::path tmp = s.tmp();
  as_user(nobody, [&] {
    for (const auto& name : names) {
      const fs::path jit_dir = tmp / name / "fusebox" / "jit";
      fs::create_directories(jit_dir);
      for (fs::path d = jit_dir; d != tmp; d = d.parent_path()) ::chmod(d.c_str(), 0777);
      std::ofstream(jit_dir / "prelude.hpp") << header;
      std::ofstream(jit_dir / "prelude.hpp.gch") << "not a precompiled header";
      std::ofstream(tmp / name / "fusebox_kernels.so", std::ios::binary) << so;
    }
  });
  // A cache directory of theirs, open to all, holding entries that would pass every content
  // check under this model's keys (the prelude's and the kernel's), with their object inside.
  const fs::path theirs = s.root() / "theirs";
  for (const auto& entry : fs::directory_iterator(s.warm() / "v1" / "artifacts"))
    plant_entry(entry.path(), theirs / "v1" / "artifacts" / entry.path().filename());
  fs::create_directories(theirs / "v1" / "blobs");
  fs::create_directories(theirs / "v1" / "tmp");
  give_to(theirs, nobody);
  fs::permissions(theirs, fs::perms::all);

  const auto r = s.run({{"FUSEBOX_CACHE_DIR", theirs.string()}}, suite::warm_batch);
  check_worker(r, 1, "disk cache disabled");
  CHECK(r.err.find("owned by uid 65534") != std::string::npos);
  CHECK(r.number("kernels_compiled") == 1);  // compiled here, in memory only
  // The prelude it used was built in a fresh private directory, not any planted one.
  const fs::path prelude = r.report.count("prelude") ? fs::path(r.report.at("prelude")) : fs::path();
  CHECK(prelude.parent_path().parent_path().parent_path().parent_path() == tmp);
  const std::string private_dir = prelude.parent_path().parent_path().parent_path().filename().string();
  CHECK(private_dir.rfind("fusebox-pch-", 0) == 0);
  CHECK(std::find(names.begin(), names.end(), private_dir) == names.end());
  // Nothing of ours is left in the temp root: only the plants, untouched.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> planted = names;
  std::sort(planted.begin(), planted.end());
  CHECK(left == planted);
  for (const auto& name : names) {
    fs::remove_all(tmp / name);
  }
  fs::remove_all(theirs);
}

TEST_CASE("hostile_cache: include directories and temp roots other users can change are refused and the call runs eagerly",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  const fs::path fresh = s.root() / "fresh-cache";  // nothing cached: each worker must compile
  const std::string include = jit::detail::fusebox_include_dir().string();
  // FUSEBOX_JIT_INCLUDE naming a directory anyone can write.
  const fs::path open_dir = s.root() / "open-include";
  fs::create_directories(open_dir);
  fs::permissions(open_dir, fs::perms::all);
  // FUSEBOX_INCLUDE_DIR naming a directory of someone else's, holding (a link to) the real headers.
  const fs::path foreign = s.root() / "foreign-include";
  fs::create_directories(foreign);
  fs::create_directory_symlink(fs::path(include) / "fusebox", foreign / "fusebox");
  // TMPDIR anyone can write, without the sticky bit (they could rename our directories).
  const fs::path open_tmp = s.root() / "open-tmp";
  fs::create_directories(open_tmp);
  fs::permissions(open_tmp, fs::perms::all);

  std::vector<std::pair<env_list, std::string>> cases{
      {{{"FUSEBOX_JIT_INCLUDE", open_dir.string()}}, "is writable by others (mode 0777)"},
      {{{"TMPDIR", open_tmp.string()}}, "the temporary directory"},
  };
  if (::geteuid() == 0) {
    give_to(foreign, nobody);
    cases.push_back({{{"FUSEBOX_INCLUDE_DIR", foreign.string()}}, "is owned by uid 65534"});
  }
  for (auto& [env, why] : cases) {
    env.push_back({"FUSEBOX_CACHE_DIR", fresh.string()});
    const auto r = s.run(env, s.fresh_batch());
    INFO("case: " << env.front().first << "=" << *env.front().second);
    check_worker(r, 1, "the JIT will not compile");
    CHECK(r.err.find(why) != std::string::npos);
    CHECK(r.err.find("Fix:") != std::string::npos);
    CHECK(r.number("compiles") == 0);
    CHECK(r.text("prelude").empty());
  }
  CHECK(fs::is_empty(open_tmp));
  CHECK(fs::is_empty(open_dir));
}

TEST_CASE("hostile_cache: cache directories that are 0777 or 0755 or another user's or symlinked or read-only",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  const fs::path base = s.root() / "modes";
  fs::create_directories(base);
  const auto check_cache = [&](const fs::path& dir, bool enabled, const std::string& why) {
    std::string said;
    jit::set_log_sink([&](std::string_view line) { said += line; });
    const jit::disk_cache cache({.directory = dir});
    jit::set_log_sink({});
    INFO("directory " << dir << ": " << said);
    CHECK(cache.enabled() == enabled);
    if (enabled) {
      CHECK(said.empty());
    } else {
      CHECK(said.rfind("[fusebox] warning: disk cache disabled", 0) == 0);
      CHECK(said.find(why) != std::string::npos);
      CHECK(said.find("Fix:") != std::string::npos);
    }
  };
  fs::create_directories(base / "open");
  fs::permissions(base / "open", fs::perms::all);
  check_cache(base / "open", false, "writable by others (mode 0777)");
  CHECK_FALSE(fs::exists(base / "open" / "v1"));
  fs::create_directories(base / "readable");
  fs::permissions(base / "readable", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                         fs::perms::others_read | fs::perms::others_exec);
  check_cache(base / "readable", true, "");  // others may read kernels, not change them
  // A private directory below one that others can write (no sticky bit): they could rename it.
  fs::create_directories(base / "open" / "inner");
  fs::permissions(base / "open" / "inner", fs::perms::owner_all);
  check_cache(base / "open" / "inner", false, "a directory above it is not safe");
  // Symlinks: to a private directory (followed), to an open one (refused).
  fs::create_directories(base / "private");
  fs::permissions(base / "private", fs::perms::owner_all);
  fs::create_directory_symlink(base / "private", base / "to-private");
  check_cache(base / "to-private", true, "");
  fs::create_directory_symlink(base / "open", base / "to-open");
  check_cache(base / "to-open", false, "(a symlink) is writable by others");
  if (need_root("another user's directory, read-only mounts")) {
    fs::create_directories(base / "nobodys");
    fs::permissions(base / "nobodys", fs::perms::owner_all);
    give_to(base / "nobodys", nobody);
    check_cache(base / "nobodys", false, "owned by uid 65534");
    if (s.mount_tmpfs(base / "ro", "size=64k,mode=0700")) {
      REQUIRE(::mount(nullptr, (base / "ro").c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
      check_cache(base / "ro", false, "Read-only file system");
    } else {
      WARN("skipped the read-only mount (mount(2) not permitted here)");
    }
  }
  // A warm cache that became read-only is still used: lookups work, stores warn once.
  std::uintmax_t warm_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(s.warm()))
    if (e.is_regular_file()) warm_bytes += e.file_size();
  if (::geteuid() == 0 &&
      s.mount_tmpfs(base / "ro-warm", "size=" + std::to_string(warm_bytes / 1024 + 16384) + "k,mode=0700")) {
    fs::copy(s.warm(), base / "ro-warm", fs::copy_options::recursive);
    REQUIRE(::mount(nullptr, (base / "ro-warm").c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
    const auto hit = s.run({{"FUSEBOX_CACHE_DIR", (base / "ro-warm").string()}}, suite::warm_batch);
    check_worker(hit, 0);
    CHECK(hit.number("compiles") == 0);
    const auto miss = s.run({{"FUSEBOX_CACHE_DIR", (base / "ro-warm").string()}}, s.fresh_batch());
    check_worker(miss, 1, "disk cache store failed");
    CHECK(miss.err.find("Read-only file system") != std::string::npos);
    CHECK(miss.number("kernels_compiled") == 1);
  }
}

TEST_CASE("hostile_cache: every cache file truncated or emptied or overwritten or replaced by a symlink is caught",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  const auto kernels = s.kernel_entries();
  REQUIRE(kernels.size() >= 1);
  const fs::path good = kernels.front();
  const fs::path lab = s.root() / "damage";
  const std::string planted = slurp(s.planted_so());
  using damage_fn = void (*)(const fs::path&, const std::string&);
  const std::vector<std::pair<const char*, damage_fn>> damages{
      {"truncated", [](const fs::path& f, const std::string&) { REQUIRE(::truncate(f.c_str(), fs::file_size(f) / 2) == 0); }},
      {"zero-length", [](const fs::path& f, const std::string&) { REQUIRE(::truncate(f.c_str(), 0) == 0); }},
      {"overwritten", [](const fs::path& f, const std::string& p) { write_file(f, p); }},
      {"a symlink", [](const fs::path& f, const std::string&) {
         const fs::path elsewhere = f.parent_path().parent_path() / (f.filename().string() + ".elsewhere");
         fs::copy_file(f, elsewhere, fs::copy_options::overwrite_existing);  // the right bytes, even
         fs::remove(f);
         fs::create_symlink(elsewhere, f);
       }}};
  // In process, for every file of a kernel entry: the lookup is a miss that removes the entry.
  for (const char* file : {"artifact.so", "meta", "key"})
    for (const auto& [what, damage] : damages) {
      INFO(file << " " << what);
      fs::remove_all(lab);
      fs::create_directories(lab / "v1" / "artifacts");
      fs::permissions(lab, fs::perms::owner_all);
      const fs::path entry = lab / "v1" / "artifacts" / good.filename();
      fs::copy(good, entry);
      damage(entry / file, planted);
      const jit::disk_cache cache({.directory = lab});
      REQUIRE(cache.enabled());
      jit::cache_key key;
      key.canonical = slurp(good / "key");
      const auto r = cache.find(key);
      CHECK(r.status != jit::disk_status::hit);
      CHECK_FALSE(r.path);
      CHECK_FALSE(fs::exists(entry));
    }
  // Through whole processes, on the warm cache: the kernel's object replaced by a link to the
  // planted one (right name, wrong content), then overwritten by it: each process recompiles
  // with one warning, and the next one is clean.
  for (const auto& [what, damage] : {damages[3], damages[2]}) {
    INFO(what);
    damage(good / "artifact.so", planted);
    if (std::string(what) == "a symlink") {  // point the link at the planted object itself
      const fs::path link_target = fs::read_symlink(good / "artifact.so");
      fs::copy_file(s.planted_so(), link_target, fs::copy_options::overwrite_existing);
    }
    const auto r = s.run({}, suite::warm_batch);
    check_worker(r, 1, "damaged kernel in the disk cache");
    CHECK(r.number("kernels_compiled") == 1);
    const auto next = s.run({}, suite::warm_batch);
    check_worker(next, 0);
    CHECK(next.number("compiles") == 0);
  }
  fs::remove(good.parent_path() / "artifact.so.elsewhere");
}

TEST_CASE("hostile_cache: a damaged precompiled prelude is rebuilt once with one warning and the next process is clean",
          "[jit][hostile_cache]") {
  suite& s = suite::get();
  const fs::path gch = s.prelude_entry() / "artifact.so";
  REQUIRE(fs::is_regular_file(gch));
  const auto size = fs::file_size(gch);
  // At start-up: truncated in the cache (a person, a full disk, a crash).
  REQUIRE(::truncate(gch.c_str(), size / 3) == 0);
  const auto r = s.run({}, s.fresh_batch());
  check_worker(r, 1, "precompiled kernel prelude");
  CHECK(r.err.find("damaged") != std::string::npos);
  CHECK(r.number("compile_failures") == 0);  // detected before use, not by a failing compile
  CHECK(r.number("kernels_compiled") == 1);
  jit::cache_key key;
  key.canonical = slurp(s.prelude_entry() / "key");
  const auto published = [&] {
    return jit::disk_cache({.directory = s.warm()}).find(key).status == jit::disk_status::hit;
  };
  CHECK(published());  // rebuilt and published again
  struct stat before {};
  REQUIRE(::stat(gch.c_str(), &before) == 0);
  const auto next = s.run({}, s.fresh_batch());
  check_worker(next, 0);
  CHECK(next.number("kernels_compiled") == 1);
  struct stat after {};
  REQUIRE(::stat(gch.c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);  // used, not rebuilt
  CHECK(next.text("prelude") == gch.string());

  // Mid-run: the prelude in use is truncated between two compiles of one process.
  const std::size_t batch = s.fresh_batch();
  s.fresh_batch();  // the worker's second kernel
  const auto mid = s.run({{"FBT_DAMAGE_MIDWAY", "1"}}, batch);
  check_worker(mid, 1, "precompiled kernel prelude");
  CHECK(mid.err.find("damaged") != std::string::npos);
  CHECK(mid.number("kernels_compiled") == 2);
  CHECK(mid.number("compile_failures") == 0);  // caught before the compiler tripped over it
  CHECK(published());
  const auto clean = s.run({}, s.fresh_batch());
  check_worker(clean, 0);
  CHECK(clean.number("compile_failures") == 0);
}

TEST_CASE("hostile_cache: two processes compiling the same kernel at once", "[jit][hostile_cache]") {
  suite& s = suite::get();
  s.warm();
  // Private prelude directories left by processes that died: ours whose maker is gone are
  // removed by the next process that prepares a prelude; a live one's and another user's stay.
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const auto leftover = [&](const std::string& name, pid_t pid) {
    const fs::path d = s.tmp() / name;
    fs::create_directories(d / "fusebox" / "jit");
    fs::permissions(d, fs::perms::owner_all);
    write_file(d / "pid", std::to_string(pid));
    return d;
  };
  const fs::path stale = leftover("fusebox-pch-stale1", dead);
  const fs::path live = leftover("fusebox-pch-live01", ::getpid());
  const fs::path theirs = leftover("fusebox-pch-their1", dead);
  if (::geteuid() == 0) give_to(theirs, nobody);
  const std::size_t batch = s.fresh_batch();
  auto a = s.start({}, batch), b = s.start({}, batch);
  const auto ra = s.finish(a), rb = s.finish(b);
  check_worker(ra, 0);
  check_worker(rb, 0);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));
  CHECK(fs::exists(theirs) == (::geteuid() == 0));  // not root: it was ours, and went
  fs::remove_all(live);
  fs::remove_all(theirs);
  CHECK(ra.number("kernels_compiled") + rb.number("kernels_compiled") >= 1);
  CHECK(fs::is_empty(s.warm() / "v1" / "tmp"));
  const auto next = s.run({}, batch);
  check_worker(next, 0);
  CHECK(next.number("compiles") == 0);
}

TEST_CASE("hostile_cache: a full disk costs the disk cache and not the results", "[jit][hostile_cache]") {
  suite& s = suite::get();
  if (!need_root("mount a small tmpfs")) return;
  const fs::path full = s.root() / "full";
  const auto prelude_bytes = fs::file_size(s.prelude_entry() / "artifact.so");
  const std::string size = "size=" + std::to_string(prelude_bytes / 1024 + 1024) + "k,mode=0700";
  if (!s.mount_tmpfs(full, size)) {
    WARN("skipped: cannot mount a tmpfs (" << size << ") here");
    return;
  }
  // The prelude fits; then a filler takes what is left, so the kernel's store hits ENOSPC.
  fs::copy(s.warm(), full, fs::copy_options::recursive);
  for (const auto& e : s.kernel_entries()) fs::remove_all(full / "v1" / "artifacts" / e.filename());
  {
    std::ofstream filler(full / "filler", std::ios::binary);
    const std::string block(1 << 16, 'x');
    while (filler.write(block.data(), block.size())) {
    }
  }
  std::ofstream(full / "filler2", std::ios::binary) << std::string(4096, 'x');  // the last crumbs
  const auto r = s.run({{"FUSEBOX_CACHE_DIR", full.string()}}, s.fresh_batch());
  check_worker(r, 1, "disk cache store failed");
  CHECK(r.err.find("No space left on device") != std::string::npos);
  CHECK(r.number("kernels_compiled") == 1);
  CHECK(fs::is_empty(full / "v1" / "tmp"));  // the failed store left nothing behind
  fs::remove(full / "filler");
  fs::remove(full / "filler2");
  const std::size_t batch = s.fresh_batch();
  const auto next = s.run({{"FUSEBOX_CACHE_DIR", full.string()}}, batch);
  check_worker(next, 0);
  const auto again = s.run({{"FUSEBOX_CACHE_DIR", full.string()}}, batch);
  check_worker(again, 0);
  CHECK(again.number("compiles") == 0);
}
