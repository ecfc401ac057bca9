// Tests for include/fusebox/runtime/host_compiler.hpp and shared_library.hpp: compile a tiny
// source, load it and call it; a syntax error is ok=false with the compiler's log; paths and
// flags with spaces and shell syntax reach the compiler verbatim (no shell); identity; the
// forbid_compiles switch; a compiled library stored in the disk cache is served to a "fresh
// process" that compiles nothing; include paths and temp roots other users can change are
// refused before the compiler starts.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/host_compiler.hpp"
#include "fusebox/runtime/posix.hpp"
#include "fusebox/runtime/shared_library.hpp"

namespace fs = std::filesystem;
namespace jit = fusebox::jit;

namespace {

class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Fast flags for tests: the defaults' -O3 -march=native work too, but cost compile time.
jit::host_compiler_options quick(jit::host_compiler_options o = {}) {
  o.flags = {"-O0", "-std=c++20", "-fPIC", "-shared"};
  return o;
}

constexpr const char* twice_plus_one = R"(extern "C" int f(int x) { return 2 * x + 1; }
)";

}  // namespace

TEST_CASE("host_compiler: compiles a source into a shared object that loads and runs",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());
  jit::counters().reset();
  const jit::host_compiler compiler;  // the defaults: -O3 -march=native ...
  CHECK(compiler.flags()[0] == "-O3");
  auto result = compiler.compile(twice_plus_one, "twice plus one");
  INFO(result.log);
  REQUIRE(result.ok);
  CHECK(result.seconds > 0);
  CHECK(result.library.filename() == "twice_plus_one.so");
  CHECK(result.library.parent_path().parent_path() == scratch.path());
  CHECK(result.command.front() == compiler.compiler());
  struct stat st {};
  REQUIRE(::stat(result.library.parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  {
    const jit::shared_library lib(result.library);
    const auto f = lib.function<int(int)>("f");
    CHECK(f(20) == 41);
    CHECK_THROWS_WITH(lib.symbol("g"), Catch::Contains("'g'") &&
                                           Catch::Contains(result.library.string()));
  }
  const auto s = jit::counters().snapshot();
  CHECK(s.compiles == 1);
  CHECK(s.compile_failures == 0);
  CHECK(s.compile_seconds > 0);

  const fs::path dir = result.library.parent_path();
  result = {};  // the last owner of the private directory is gone: so is the directory
  CHECK_FALSE(fs::exists(dir));
  CHECK(fs::is_empty(scratch.path()));
}

TEST_CASE("host_compiler: a syntax error is ok=false with the compiler's log",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());
  jit::counters().reset();
  const jit::host_compiler compiler(quick());
  const auto result = compiler.compile("extern \"C\" int f(int x) { return x +; }\n", "broken");
  CHECK_FALSE(result.ok);
  CHECK(result.library.empty());
  CHECK(result.log.find("error") != std::string::npos);
  CHECK(result.log.find("broken.cpp") != std::string::npos);
  CHECK(result.log.find("exited with status") != std::string::npos);
  CHECK(jit::counters().compile_failures.load() == 1);
}

TEST_CASE("host_compiler: paths with spaces and shell syntax in flags pass verbatim",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  const fs::path tmp = scratch.path() / "tmp dir with spaces";
  fs::create_directory(tmp);
  scoped_env env("TMPDIR", tmp.c_str());  // so the source and -o paths hold spaces
  const fs::path include = scratch.path() / "include dir; $(echo x)";
  fs::create_directory(include);
  write_file(include / "helper.hpp", "inline int helper() { return 7; }\n");
  const fs::path pwned = scratch.path() / "pwned";
  // A shell would run the command substitution and split at the spaces and the ';'.
  const std::string value = "$(touch " + pwned.string() + "); a   b 'c'";
  auto options = quick();
  options.include_dirs = {include};
  options.extra_flags = {"-DTEXT=" + value};
  const jit::host_compiler compiler(options);
  const auto result = compiler.compile(R"(
#include "helper.hpp"
#define FB_STR(x) #x
#define FB_XSTR(x) FB_STR(x)
extern "C" int h() { return helper(); }
extern "C" const char* text() { return FB_XSTR(TEXT); }
)", "spaces");
  INFO(result.log);
  REQUIRE(result.ok);
  CHECK(result.library.string().find("tmp dir with spaces") != std::string::npos);
  const jit::shared_library lib(result.library);
  CHECK(lib.function<int()>("h")() == 7);
  // Stringification collapses runs of white space into one: that is the preprocessor, not a
  // shell; the substitution and the quotes arrive untouched.
  CHECK(std::string(lib.function<const char*()>("text")()) ==
        "$(touch " + pwned.string() + "); a b 'c'");
  CHECK_FALSE(fs::exists(pwned));
}

TEST_CASE("host_compiler: identity names the compiler, its version and every flag",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());  // `--version` runs in a directory there
  auto options = quick();
  options.extra_flags = {"-DA=1 2"};
  const jit::host_compiler compiler(options);
  const std::string& id = compiler.identity();
  CHECK(&id == &compiler.identity());  // computed once
  CHECK(id.rfind("compiler /", 0) == 0);  // resolved to a path
  CHECK(id.find("\nversion ") != std::string::npos);
  CHECK(id.find("\nversion unknown") == std::string::npos);
  CHECK(id.find(" 3:-O0") != std::string::npos);
  CHECK(id.find(" 7:-DA=1 2") != std::string::npos);  // length-prefixed: one flag, not two
  CHECK(id.find("-I") != std::string::npos);          // the fusebox include directory

  auto other = options;
  other.extra_flags = {"-DA=1", "2"};
  CHECK(jit::host_compiler(other).identity() != id);
}

TEST_CASE("host_compiler: FUSEBOX_CXX chooses the compiler; a missing one fails cleanly",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());
  scoped_env cxx("FUSEBOX_CXX", "fusebox-no-such-compiler");
  const jit::host_compiler compiler(quick());
  CHECK(compiler.compiler() == "fusebox-no-such-compiler");
  const auto result = compiler.compile(twice_plus_one);
  CHECK_FALSE(result.ok);
  CHECK(result.log.find("cannot start 'fusebox-no-such-compiler'") != std::string::npos);
  CHECK(compiler.identity().find("version unknown") != std::string::npos);
}

TEST_CASE("host_compiler: a compiler that hangs is killed at the timeout",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-cxx-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());
  const fs::path fake = scratch.path() / "hanging-cxx";
  write_file(fake, "#!/bin/sh\nexec sleep 30\n");
  fs::permissions(fake, fs::perms::owner_all);
  auto options = quick();
  options.compiler = fake.string();
  options.timeout_seconds = 0.2;
  const auto result = jit::host_compiler(options).compile(twice_plus_one);
  CHECK_FALSE(result.ok);
  CHECK(result.log.find("killed after") != std::string::npos);
  CHECK(result.seconds < 5);
}

TEST_CASE("host_compiler: forbid_compiles makes any compile throw", "[jit][host_compiler]") {
  jit::counters().reset();
  const jit::host_compiler compiler(quick());
  jit::forbid_compiles(true);
  CHECK(jit::compiles_forbidden());
  CHECK_THROWS_AS(compiler.compile(twice_plus_one), jit::compile_forbidden);
  jit::forbid_compiles(false);
  CHECK(jit::counters().compiles.load() == 0);
}

TEST_CASE("shared_library: errors name the path and the loader's reason",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-so-");
  const fs::path missing = scratch.path() / "missing.so";
  CHECK_THROWS_AS(jit::shared_library(missing), jit::load_error);
  CHECK_THROWS_WITH(jit::shared_library(missing), Catch::Contains(missing.string()));
  const fs::path not_elf = scratch.path() / "not-elf.so";
  write_file(not_elf, "hello");
  CHECK_THROWS_WITH(jit::shared_library(not_elf), Catch::Contains("not-elf.so"));
  // A bare name is a file in the current directory, never a search of the library path.
  CHECK_THROWS_WITH(jit::shared_library(fs::path("libc.so.6")), Catch::Contains("./libc.so.6"));
  const auto libc = jit::shared_library::system("libc.so.6");
  CHECK(libc.symbol("strlen") != nullptr);
  jit::shared_library moved = jit::shared_library::system("libc.so.6");
  jit::shared_library target;
  CHECK_FALSE(target);
  target = std::move(moved);
  CHECK(target);
  CHECK_FALSE(moved);
}

TEST_CASE("host_compiler + disk_cache: a warm process loads without compiling",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-warm-");
  scoped_env tmp("TMPDIR", scratch.path().c_str());
  scoped_env dir("FUSEBOX_CACHE_DIR", (scratch.path() / "cache").c_str());
  const jit::host_compiler compiler(quick());
  jit::cache_key key;
  key.add("graph", "2*x+1").add("compiler", compiler.identity());

  {  // cold: miss, compile, store, load from the cache
    jit::disk_cache cache;
    REQUIRE_FALSE(cache.lookup(key));
    const auto result = compiler.compile(twice_plus_one);
    REQUIRE(result.ok);
    const auto stored = cache.store(key, result.library);
    REQUIRE(stored);
    CHECK(jit::shared_library(*stored).function<int(int)>("f")(1) == 3);
  }
  {  // warm: a fresh cache object, compiles forbidden
    jit::forbid_compiles(true);
    jit::counters().reset();
    jit::disk_cache cache;
    const auto path = cache.lookup(key);
    REQUIRE(path);
    CHECK(jit::shared_library(*path).function<int(int)>("f")(5) == 11);
    CHECK(jit::counters().compiles.load() == 0);
    CHECK(jit::counters().disk_hits.load() == 1);
    jit::forbid_compiles(false);
  }
}

TEST_CASE("host_compiler: include paths and a temp root that other users can change are refused",
          "[jit][host_compiler]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-trust-");
  const auto make_dir = [&](const fs::path& d, fs::perms mode) {
    fs::create_directories(d);
    fs::permissions(d, mode);
    return d;
  };
  const fs::path open = make_dir(scratch.path() / "open", fs::perms::all);
  const fs::path sticky = make_dir(scratch.path() / "sticky", fs::perms::all | fs::perms::sticky_bit);
  const fs::path under_open = make_dir(open / "private", fs::perms::owner_all);
  const fs::path good = make_dir(scratch.path() / "good", fs::perms::owner_all);
  // Options without designated initializers (-Wmissing-field-initializers).
  const auto options = [](std::vector<fs::path> includes, std::vector<std::string> extra = {}) {
    jit::host_compiler_options o;
    o.include_dirs = std::move(includes);
    o.extra_flags = std::move(extra);
    return o;
  };
  const auto refused = [](jit::host_compiler_options o, const std::string& why) {
    jit::counters().reset();
    const jit::host_compiler compiler(quick(std::move(o)));
    REQUIRE(compiler.untrusted_inputs());
    CHECK_THAT(*compiler.untrusted_inputs(), Catch::Contains(why) && Catch::Contains("Fix:"));
    const auto result = compiler.compile(twice_plus_one);
    CHECK_FALSE(result.ok);
    CHECK_THAT(result.log, Catch::Contains("refused to run the compiler") && Catch::Contains(why));
    CHECK(jit::counters().compiles.load() == 0);  // the compiler never started
  };
  refused(options({open}), "'" + open.string() + "' is writable by others (mode 0777)");
  refused(options({sticky}), "is writable by others (mode 1777)");  // sticky is no excuse here
  refused(options({under_open}), "above '" + under_open.string() + "'");
  refused(options({}, {"-isystem", open.string()}), "'" + open.string() + "'");
  write_file(open / "x.h", "");
  refused(options({}, {"-include", (open / "x.h").string()}), "writable by others");
  // A file anyone may edit inside a trusted directory, and a link to one.
  write_file(good / "evil.h", "");
  fs::permissions(good / "evil.h", fs::perms::all);
  refused(options({good}), "evil.h' is writable by others (mode 0777)");
  fs::remove(good / "evil.h");
  fs::create_symlink(open / "x.h", good / "link.h");
  refused(options({good}), "(through '" + (good / "link.h").string() + "')");
  fs::remove(good / "link.h");
  {  // TMPDIR anyone can write without the sticky bit: they could rename our private directory
    scoped_env tmp("TMPDIR", open.c_str());
    refused(options({}), "the temporary directory '" + open.string() + "' (TMPDIR) is not safe");
  }
  // Trusted: a private include directory, and TMPDIR a sticky directory like /tmp.
  scoped_env tmp("TMPDIR", sticky.c_str());
  const jit::host_compiler compiler(quick(options({good})));
  CHECK_FALSE(compiler.untrusted_inputs());
  const auto result = compiler.compile(twice_plus_one);
  INFO(result.log);
  REQUIRE(result.ok);
  CHECK(jit::shared_library(result.library).function<int(int)>("f")(20) == 41);
}

TEST_CASE("temp_directory: mode 0700 whatever the umask, owned by the current user",
          "[jit][host_compiler]") {
  const mode_t old = ::umask(0777);
  jit::temp_directory dir(jit::detail::temp_root(), "fusebox-test-umask-");
  ::umask(old);
  struct stat st {};
  REQUIRE(::lstat(dir.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  CHECK(st.st_uid == ::geteuid());
  CHECK_FALSE(jit::detail::untrusted_directory(dir.path()));
}
