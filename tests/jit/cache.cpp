// Tests for include/fusebox/runtime/{cache_key,memory_cache,disk_cache,counters}.hpp: the key is
// unambiguous and compared in full; the memory cache creates once under threads, does not cache
// failures and keeps colliding keys apart; the disk cache refuses directories others can write,
// detects corrupt and mismatched entries, evicts least recently used entries under its cap, and
// never hands a torn entry to processes sharing it; the directories above the cache are checked too.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/disk_cache.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/memory_cache.hpp"
#include "fusebox/runtime/posix.hpp"

namespace fs = std::filesystem;
namespace jit = fusebox::jit;

namespace {

/// Sets (or unsets) an environment variable for one scope.
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

/// Collects log lines and warnings for one scope.
class captured_logs {
 public:
  captured_logs() {
    jit::set_log_sink([this](std::string_view line) { text += line; });
  }
  ~captured_logs() { jit::set_log_sink({}); }
  std::string text;
};

/// A private scratch directory, with FUSEBOX_CACHE_DIR pointing at <scratch>/cache.
struct cache_scratch {
  jit::temp_directory root{jit::detail::temp_root(), "fusebox-test-cache-"};
  fs::path cache_dir = root.path() / "cache";
  scoped_env env{"FUSEBOX_CACHE_DIR", cache_dir.c_str()};
  scoped_env no_cap{"FUSEBOX_CACHE_MAX_BYTES", nullptr};
};

jit::cache_key make_key(const std::string& graph, int batch = 64) {
  jit::cache_key key;
  key.add("graph", graph).add("extents", std::vector<int>{batch, 784}).add("dtype", "f32");
  return key;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void set_mtime(const fs::path& path, long seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

std::string payload_for(int index, std::size_t size) {
  std::string bytes(size, '\0');
  std::uint32_t x = 2463534242u + static_cast<std::uint32_t>(index) * 7919u;
  for (auto& b : bytes) {  // xorshift: every entry's bytes differ throughout
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<char>(x);
  }
  return bytes;
}

}  // namespace

// --- cache_key -------------------------------------------------------------------------------

TEST_CASE("cache_key: fields are length-prefixed, so no two field lists share a text",
          "[jit][cache]") {
  jit::cache_key a, b;
  a.add("graph", "ab").add("x", "c");
  b.add("graph", "a").add("x", "bc");
  CHECK(a != b);
  jit::cache_key c, d;  // a value that looks like the next field must not pass for one
  c.add("v", "1\n1:x=1:2");
  d.add("v", "1").add("x", "2");
  CHECK(c != d);
  CHECK(a.canonical == "5:graph=2:ab\n1:x=1:c\n");
  CHECK(a.digest() == jit::sha256_hex(a.canonical));
  CHECK(a.digest().size() == 64);
  CHECK(a == jit::cache_key{a.canonical});
}

TEST_CASE("cache_key: numbers, lists and booleans have one spelling", "[jit][cache]") {
  jit::cache_key key;
  key.add("n", 64).add("big", std::size_t{1} << 40).add("neg", -3).add("f", 0.1).add("on", true);
  key.add("extents", std::vector<std::size_t>{64, 784}).add("empty", std::vector<int>{});
  key.add("text", std::string("s")).add("literal", "l");
  const auto fields = key.fields();
  REQUIRE(fields.size() == 9);
  CHECK(fields[0].second == "64");
  CHECK(fields[1].second == "1099511627776");
  CHECK(fields[2].second == "-3");
  CHECK(fields[3].second == "0.1");
  CHECK(fields[4].second == "true");
  CHECK(fields[5].second == "[64,784]");
  CHECK(fields[6].second == "[]");
  CHECK(fields[7] == std::pair<std::string_view, std::string_view>{"text", "s"});
  CHECK(fields[8].second == "l");
  CHECK_THROWS_AS(jit::cache_key{"3:abc=2:x\n"}.fields(), std::invalid_argument);
  CHECK_THROWS_AS(jit::cache_key{"99:abc"}.fields(), std::invalid_argument);
}

TEST_CASE("cache_key: difference names the fields that changed", "[jit][cache]") {
  CHECK(jit::difference(make_key("g"), make_key("g")).empty());
  CHECK(jit::difference(make_key("g", 64), make_key("g", 32)) == "extents: [64,784] -> [32,784]");
  auto longer = make_key("g");
  longer.add("mode", "max_autotune");
  CHECK(jit::difference(make_key("g"), longer) == "mode: (absent) -> max_autotune");
}

// --- memory_cache ----------------------------------------------------------------------------

TEST_CASE("memory_cache: threads asking for one key run the factory once", "[jit][cache]") {
  jit::memory_cache<std::shared_ptr<int>> cache;
  std::atomic<int> calls{0};
  std::atomic<int> arrived{0};
  constexpr int threads = 8;
  std::vector<std::shared_ptr<int>> got(threads);
  std::vector<jit::cache_outcome> outcomes(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      arrived.fetch_add(1);
      got[t] = cache.get_or_create(
          make_key("once"),
          [&] {
            calls.fetch_add(1);
            while (arrived.load() != threads) std::this_thread::yield();
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            return std::make_shared<int>(42);
          },
          &outcomes[t]);
    });
  for (auto& t : pool) t.join();
  CHECK(calls.load() == 1);
  int created = 0;
  for (int t = 0; t < threads; ++t) {
    CHECK(got[t] == got[0]);  // the same object, not an equal one
    created += outcomes[t] == jit::cache_outcome::created;
  }
  CHECK(*got[0] == 42);
  CHECK(created == 1);
  jit::cache_outcome again{};
  CHECK(cache.get_or_create(make_key("once"), [] { return std::make_shared<int>(0); }, &again) ==
        got[0]);
  CHECK(again == jit::cache_outcome::hit);
}

TEST_CASE("memory_cache: a failed factory is not cached and reaches every waiter",
          "[jit][cache]") {
  jit::memory_cache<int> cache;
  std::atomic<int> calls{0};
  std::atomic<int> arrived{0};
  std::atomic<int> failures{0};
  constexpr int threads = 6;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      arrived.fetch_add(1);
      try {
        cache.get_or_create(make_key("fails"), [&]() -> int {
          calls.fetch_add(1);
          while (arrived.load() != threads) std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the rest queue
          throw std::runtime_error("compile failed");
        });
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) == "compile failed") failures.fetch_add(1);
      }
    });
  for (auto& t : pool) t.join();
  CHECK(failures.load() == threads);
  CHECK(calls.load() == 1);
  CHECK(cache.size() == 0);
  CHECK_FALSE(cache.find(make_key("fails")).has_value());
  // The next request tries again, and success is cached.
  CHECK(cache.get_or_create(make_key("fails"), [] { return 7; }) == 7);
  CHECK(cache.find(make_key("fails")) == 7);
}

TEST_CASE("memory_cache: keys that collide on the bucket hash stay distinct", "[jit][cache]") {
  jit::memory_cache<std::string> cache([](const jit::cache_key&) -> std::uint64_t { return 7; });
  const auto a = make_key("a"), b = make_key("b");
  REQUIRE(a != b);
  CHECK(cache.get_or_create(a, [] { return std::string("kernel a"); }) == "kernel a");
  CHECK(cache.get_or_create(b, [] { return std::string("kernel b"); }) == "kernel b");
  CHECK(cache.get_or_create(a, [] { return std::string("wrong"); }) == "kernel a");
  CHECK(cache.get_or_create(b, [] { return std::string("wrong"); }) == "kernel b");
  CHECK(cache.size() == 2);
  CHECK(cache.find(make_key("a", 32)) == std::nullopt);  // same bucket, different key: a miss
  cache.clear();
  CHECK(cache.size() == 0);
  CHECK(cache.get_or_create(a, [] { return std::string("rebuilt"); }) == "rebuilt");
}

TEST_CASE("memory_cache: a factory asking for its own key is an error, not a deadlock",
          "[jit][cache]") {
  jit::memory_cache<int> cache;
  const auto key = make_key("self");
  CHECK_THROWS_AS(cache.get_or_create(key, [&] { return cache.get_or_create(key, [] { return 1; }); }),
                  std::logic_error);
  CHECK(cache.size() == 0);
}

// --- counters --------------------------------------------------------------------------------

TEST_CASE("counters: snapshot, bounded recompile reasons, reset", "[jit][cache]") {
  auto& c = jit::counters();
  c.reset();
  c.hits += 2;
  c.add_compile_seconds(0.25);
  for (std::size_t i = 0; i < jit::counter_set::max_reasons + 3; ++i)
    c.add_recompile("reason " + std::to_string(i));
  const auto s = c.snapshot();
  CHECK(s.hits == 2);
  CHECK(s.compile_seconds == Approx(0.25));
  CHECK(s.recompiles == jit::counter_set::max_reasons + 3);
  CHECK(s.recompile_reasons.size() == jit::counter_set::max_reasons);
  CHECK(s.recompile_reasons.front() == "reason 3");
  CHECK(s.recompile_reasons_dropped == 3);
  c.reset();
  CHECK(c.snapshot().recompile_reasons.empty());
  CHECK(c.snapshot().hits == 0);
}

// --- disk_cache ------------------------------------------------------------------------------

TEST_CASE("disk_cache: directory from the environment, created 0700", "[jit][cache]") {
  jit::temp_directory scratch(jit::detail::temp_root(), "fusebox-test-dirs-");
  scoped_env no_dir("FUSEBOX_CACHE_DIR", nullptr);
  {
    const auto xdg = scratch.path() / "xdg";
    scoped_env env("XDG_CACHE_HOME", xdg.c_str());
    CHECK(jit::disk_cache::default_directory() == xdg / "fusebox");
    jit::disk_cache cache;
    REQUIRE(cache.enabled());
    CHECK(cache.directory() == fs::canonical(xdg / "fusebox"));
    struct stat st {};
    REQUIRE(::stat((xdg / "fusebox").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    REQUIRE(::stat(xdg.c_str(), &st) == 0);  // a parent it created: 0700 too
    CHECK((st.st_mode & 0777) == 0700);
  }
  {
    scoped_env no_xdg("XDG_CACHE_HOME", "relative/is/ignored");
    const auto home = scratch.path() / "home";
    scoped_env env("HOME", home.c_str());
    CHECK(jit::disk_cache::default_directory() == home / ".cache" / "fusebox");
  }
  {
    const auto mine = scratch.path() / "explicit" / "dir";
    scoped_env env("FUSEBOX_CACHE_DIR", "/nonexistent-should-not-be-used");
    jit::disk_cache cache({.directory = mine});
    CHECK(cache.enabled());
    CHECK(fs::is_directory(mine / "v1" / "artifacts"));
  }
}

TEST_CASE("disk_cache: FUSEBOX_CACHE_MAX_BYTES", "[jit][cache]") {
  cache_scratch scratch;
  {
    scoped_env env("FUSEBOX_CACHE_MAX_BYTES", "64K");
    CHECK(jit::disk_cache().max_bytes() == 65536);
  }
  {
    scoped_env env("FUSEBOX_CACHE_MAX_BYTES", "2GiB");
    CHECK(jit::disk_cache().max_bytes() == (std::uint64_t{2} << 30));
  }
  {
    scoped_env env("FUSEBOX_CACHE_MAX_BYTES", "lots");
    captured_logs logs;
    CHECK(jit::disk_cache().max_bytes() == jit::disk_cache::default_max_bytes);
    CHECK(logs.text.find("FUSEBOX_CACHE_MAX_BYTES='lots'") != std::string::npos);
  }
  CHECK(jit::disk_cache().max_bytes() == jit::disk_cache::default_max_bytes);
  CHECK(jit::disk_cache({.max_bytes = 123}).max_bytes() == 123);
}

TEST_CASE("disk_cache: store then lookup; the entry holds key, meta and payload",
          "[jit][cache]") {
  cache_scratch scratch;
  jit::counters().reset();
  jit::disk_cache cache;
  REQUIRE(cache.enabled());
  const auto key = make_key("roundtrip");
  CHECK(cache.find(key).status == jit::disk_status::absent);
  CHECK_FALSE(cache.lookup(key));

  const std::string bytes = payload_for(1, 5000);
  const auto stored = cache.store_bytes(key, bytes);
  REQUIRE(stored);
  CHECK(stored->parent_path() == cache.entry_directory(key));
  CHECK(stored->parent_path().filename() == key.digest());
  const auto found = cache.lookup(key);
  REQUIRE(found);
  CHECK(*found == *stored);
  CHECK(slurp(*found) == bytes);
  CHECK(slurp(found->parent_path() / "key") == key.canonical);
  CHECK(slurp(found->parent_path() / "meta") ==
        "fusebox-cache-entry 1\nkind artifact\nsize 5000\nsha256 " + jit::sha256_hex(bytes) +
            "\n");
  CHECK_FALSE(cache.lookup(make_key("roundtrip", 32)));  // another key: absent

  // From a file, and again under the same key: the first entry is kept.
  const auto source = scratch.root.path() / "artifact with spaces.so";
  write_file(source, payload_for(2, 3000));
  const auto other = make_key("from file");
  REQUIRE(cache.store(other, source));
  CHECK(slurp(*cache.lookup(other)) == payload_for(2, 3000));
  CHECK(cache.store_bytes(key, bytes) == stored);

  const auto s = jit::counters().snapshot();
  CHECK(s.disk_stores == 2);
  CHECK(s.disk_hits == 2);
  CHECK(s.disk_misses == 3);  // absent twice before the store, and the other key
  // Nothing left behind in staging.
  CHECK(fs::is_empty(cache.directory() / "v1" / "tmp"));
}

TEST_CASE("disk_cache: blobs round-trip with the same checks", "[jit][cache]") {
  cache_scratch scratch;
  jit::disk_cache cache;
  const auto key = make_key("autotune winner");
  CHECK_FALSE(cache.lookup_blob(key));
  REQUIRE(cache.store_blob(key, "block=256 vector=8"));
  CHECK(cache.lookup_blob(key) == "block=256 vector=8");
  CHECK_FALSE(cache.lookup(key));  // blobs and artifacts are separate kinds

  write_file(cache.entry_directory(key, true) / "blob", "block=999 vector=8");  // same size
  const auto r = cache.find_blob(key);
  CHECK(r.status == jit::disk_status::corrupt);
  CHECK(r.reason.find("content hash mismatch") != std::string::npos);
  CHECK_FALSE(fs::exists(cache.entry_directory(key, true)));
}

TEST_CASE("disk_cache: a directory others can write is refused; memory only",
          "[jit][cache]") {
  cache_scratch scratch;
  fs::create_directories(scratch.cache_dir);
  REQUIRE(::chmod(scratch.cache_dir.c_str(), 0777) == 0);
  {
    captured_logs logs;
    jit::disk_cache cache;
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("writable by others (mode 0777)") != std::string::npos);
    CHECK(logs.text.find("disk cache disabled") != std::string::npos);
    CHECK(logs.text.find("[fusebox] warning:") == 0);
    CHECK_FALSE(cache.store_bytes(make_key("x"), "bytes"));
    CHECK(cache.find(make_key("x")).status == jit::disk_status::disabled);
    CHECK_FALSE(cache.store_blob(make_key("x"), "bytes"));
    CHECK_FALSE(fs::exists(scratch.cache_dir / "v1"));  // nothing was written there
  }
  REQUIRE(::chmod(scratch.cache_dir.c_str(), 0770) == 0);
  {
    captured_logs logs;
    jit::disk_cache cache;
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("writable by its group") != std::string::npos);
  }
  // A symlink to such a directory is refused too; a symlink to a private one is followed.
  const auto link = scratch.root.path() / "link";
  fs::create_directory_symlink(scratch.cache_dir, link);
  {
    captured_logs logs;
    CHECK_FALSE(jit::disk_cache({.directory = link}).enabled());
  }
  REQUIRE(::chmod(scratch.cache_dir.c_str(), 0700) == 0);
  {
    jit::disk_cache cache({.directory = link});
    CHECK(cache.enabled());
    CHECK(cache.directory() == fs::canonical(scratch.cache_dir));
  }
  // Owned by someone else (only root can arrange that here).
  if (::geteuid() == 0) {
    REQUIRE(::chown(scratch.cache_dir.c_str(), 12345, 12345) == 0);
    captured_logs logs;
    jit::disk_cache cache;
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("owned by uid 12345") != std::string::npos);
  }
}

TEST_CASE("disk_cache: a truncated or corrupted artifact is detected, removed, and a miss",
          "[jit][cache]") {
  cache_scratch scratch;
  jit::disk_cache cache;
  const auto key = make_key("corrupt");
  const std::string bytes = payload_for(3, 10000);
  const auto path = cache.store_bytes(key, bytes);
  REQUIRE(path);

  REQUIRE(::truncate(path->c_str(), 4000) == 0);
  auto r = cache.find(key);
  CHECK(r.status == jit::disk_status::corrupt);
  CHECK_FALSE(r.path);
  CHECK(r.reason.find("truncated") != std::string::npos);
  CHECK(r.reason.find("removed") != std::string::npos);
  CHECK_FALSE(fs::exists(cache.entry_directory(key)));
  CHECK(cache.find(key).status == jit::disk_status::absent);

  // Same size, one byte flipped: only the content hash can tell.
  REQUIRE(cache.store_bytes(key, bytes));
  std::string flipped = bytes;
  flipped[5000] ^= 1;
  write_file(*path, flipped);
  r = cache.find(key);
  CHECK(r.status == jit::disk_status::corrupt);
  CHECK(r.reason.find("content hash mismatch") != std::string::npos);

  // A malformed meta file, and a missing payload.
  REQUIRE(cache.store_bytes(key, bytes));
  write_file(cache.entry_directory(key) / "meta", "fusebox-cache-entry 1\nkind artifact\n");
  CHECK(cache.find(key).status == jit::disk_status::corrupt);
  REQUIRE(cache.store_bytes(key, bytes));
  fs::remove(*path);
  CHECK(cache.find(key).status == jit::disk_status::corrupt);

  // A symlinked payload is not followed.
  REQUIRE(cache.store_bytes(key, bytes));
  const auto elsewhere = scratch.root.path() / "elsewhere.so";
  write_file(elsewhere, bytes);
  fs::remove(*path);
  fs::create_symlink(elsewhere, *path);
  CHECK(cache.find(key).status == jit::disk_status::corrupt);

  // Storing over a corrupt entry replaces it.
  REQUIRE(cache.store_bytes(key, bytes));
  REQUIRE(::truncate(path->c_str(), 10) == 0);
  REQUIRE(cache.store_bytes(key, bytes) == path);
  CHECK(slurp(*cache.lookup(key)) == bytes);
}

TEST_CASE("disk_cache: an entry holding another key under this key's name is a miss",
          "[jit][cache]") {
  cache_scratch scratch;
  jit::disk_cache cache;
  const auto mine = make_key("mine"), theirs = make_key("theirs");
  REQUIRE(cache.store_bytes(theirs, "their kernel"));
  // Put their (valid) entry under my digest, as a hash collision or a planted entry would.
  fs::rename(cache.entry_directory(theirs), cache.entry_directory(mine));
  const auto r = cache.find(mine);
  CHECK(r.status == jit::disk_status::wrong_key);
  CHECK_FALSE(r.path);
  CHECK_FALSE(fs::exists(cache.entry_directory(mine)));
  CHECK_FALSE(cache.lookup(theirs));
}

TEST_CASE("disk_cache: least recently used entries go first when over the cap",
          "[jit][cache]") {
  cache_scratch scratch;
  jit::counters().reset();
  // Each entry: 10000 payload bytes plus ~150 of key and meta; the cap holds three.
  jit::disk_cache cache({.max_bytes = 32000});
  const auto a = make_key("a"), b = make_key("b"), c = make_key("c"), d = make_key("d");
  REQUIRE(cache.store_bytes(a, payload_for(1, 10000)));
  REQUIRE(cache.store_bytes(b, payload_for(2, 10000)));
  REQUIRE(cache.store_bytes(c, payload_for(3, 10000)));
  CHECK(jit::counters().evictions.load() == 0);
  // A clear order, whatever the file system's timestamp granularity: a oldest, then b, c.
  set_mtime(cache.entry_directory(a), 1000);
  set_mtime(cache.entry_directory(b), 2000);
  set_mtime(cache.entry_directory(c), 3000);
  REQUIRE(cache.lookup(a));  // a is now the most recently used
  REQUIRE(cache.store_bytes(d, payload_for(4, 10000)));
  CHECK(jit::counters().evictions.load() == 1);
  CHECK(cache.lookup(a));
  CHECK_FALSE(cache.lookup(b));
  CHECK(cache.lookup(c));
  CHECK(cache.lookup(d));
  CHECK(cache.size_bytes() <= 32000);

  // An entry larger than the cap is still kept: it was just stored, and is about to be loaded.
  jit::disk_cache tiny({.max_bytes = 100});
  const auto big = tiny.store_bytes(make_key("big"), payload_for(5, 1000));
  REQUIRE(big);
  CHECK(tiny.lookup(make_key("big")) == big);
  CHECK_FALSE(tiny.lookup(a));  // everything else went
  tiny.clear();
  CHECK(tiny.size_bytes() == 0);
}

TEST_CASE("disk_cache: processes sharing the directory never load a torn entry",
          "[jit][cache]") {
  cache_scratch scratch;
  constexpr int children = 4;
  constexpr int rounds = 24;
  constexpr int shared_keys = 5;
  constexpr std::size_t payload_size = 96 * 1024;  // many write() calls per payload
  // A cap of about six entries, so eviction runs concurrently with stores and lookups.
  const std::uint64_t cap = 6 * (payload_size + 300);
  { jit::disk_cache warm({.max_bytes = cap}); REQUIRE(warm.enabled()); }

  std::vector<pid_t> pids;
  for (int child = 0; child < children; ++child) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Child: no Catch2 here; the exit status is the verdict.
      int bad = 0;
      try {
        jit::disk_cache cache({.max_bytes = cap});
        if (!cache.enabled()) ::_exit(3);
        for (int round = 0; round < rounds; ++round) {
          // Alternate shared keys (every child races on them) and keys of its own.
          const int index =
              round % 2 == 0 ? (round / 2 + child) % shared_keys : 100 + child * rounds + round;
          const auto key = make_key("concurrent " + std::to_string(index));
          const std::string expected = payload_for(index, payload_size);
          const auto check_file = [&](const fs::path& path) {
            std::error_code ec;
            const std::string got = slurp(path);
            // Evicted by another child between lookup and read: a miss, not a torn entry.
            if (got.empty() && !fs::exists(path, ec)) return;
            if (got != expected) ++bad;
          };
          if (const auto hit = cache.lookup(key)) check_file(*hit);
          if (const auto stored = cache.store_bytes(key, expected)) check_file(*stored);
          else ++bad;
          if (const auto hit = cache.lookup(key)) check_file(*hit);
          const auto blob_key = make_key("blob " + std::to_string(index % shared_keys));
          const std::string blob = payload_for(1000 + index % shared_keys, 2000);
          if (!cache.store_blob(blob_key, blob)) ++bad;
          if (const auto got = cache.lookup_blob(blob_key); got && *got != blob) ++bad;
        }
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(bad == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (const pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("child exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  // Afterwards every entry left in the directory verifies, and staging is empty.
  jit::disk_cache cache({.max_bytes = cap});
  int entries = 0;
  for (int index = 0; index < shared_keys; ++index) {
    const auto key = make_key("concurrent " + std::to_string(index));
    const auto r = cache.find(key);
    CHECK((r.status == jit::disk_status::hit || r.status == jit::disk_status::absent));
    if (r.path) {
      ++entries;
      CHECK(slurp(*r.path) == payload_for(index, payload_size));
    }
  }
  CHECK(fs::is_empty(cache.directory() / "v1" / "tmp"));
  CHECK(cache.size_bytes() <= cap + payload_size + 300);
}

TEST_CASE("disk_cache: a writer killed mid-store leaves no live entry, and its leftovers go",
          "[jit][cache]") {
  cache_scratch scratch;
  { REQUIRE(jit::disk_cache().enabled()); }
  const std::string big(4 << 20, 'x');
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    jit::disk_cache cache;
    for (int i = 0;; ++i) cache.store_bytes(make_key("killed " + std::to_string(i)), big);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);

  jit::disk_cache cache;
  int complete = 0;
  for (int i = 0; i < 1000; ++i) {
    const auto r = cache.find(make_key("killed " + std::to_string(i)));
    if (r.status == jit::disk_status::absent) break;
    CHECK(r.status == jit::disk_status::hit);  // published entries are whole, never torn
    ++complete;
  }
  INFO(complete << " complete entries before the kill");
  // The interrupted store is only a staging directory; once old, the next store removes it.
  const auto staging = cache.directory() / "v1" / "tmp";
  for (const auto& item : fs::directory_iterator(staging)) set_mtime(item.path(), 1000);
  REQUIRE(cache.store_bytes(make_key("after the crash"), "x"));
  CHECK(fs::is_empty(staging));
}

TEST_CASE("disk_cache: the directories above the cache must be safe too (sticky ones are)",
          "[jit][cache]") {
  cache_scratch scratch;
  const auto open = scratch.root.path() / "open";
  fs::create_directories(open / "cache");
  fs::permissions(open / "cache", fs::perms::owner_all);
  fs::permissions(open, fs::perms::all);  // anyone could rename 'cache' and put theirs there
  {
    captured_logs logs;
    jit::disk_cache cache({.directory = open / "cache"});
    CHECK_FALSE(cache.enabled());
    CHECK(cache.disabled_reason().find("a directory above it is not safe: '" + open.string() +
                                       "' is writable by others (mode 0777)") != std::string::npos);
    CHECK(logs.text.find("Fix:") != std::string::npos);
    CHECK_FALSE(fs::exists(open / "cache" / "v1"));
  }
  fs::permissions(open, fs::perms::all | fs::perms::sticky_bit);  // like /tmp: only we may rename ours
  jit::disk_cache cache({.directory = open / "cache"});
  CHECK(cache.enabled());
  CHECK(cache.store_bytes(make_key("sticky parent"), "bytes"));
}
