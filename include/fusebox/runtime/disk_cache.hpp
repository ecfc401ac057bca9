// fusebox/runtime/disk_cache.hpp: the on-disk JIT cache, shared by every process of one user
// (DESIGN.md: "The cache is a trust boundary"). What it loads is machine code, so the rules are:
//
// Directory: an explicit one, else FUSEBOX_CACHE_DIR, else $XDG_CACHE_HOME/fusebox, else
// ~/.cache/fusebox. Missing directories are created with mode 0700. The cache is REFUSED
// (disabled: one warning, the JIT then caches in memory only) when the directory, or the target
// of a symlink to it, is not a directory owned by the current user or is writable by group or
// others: anyone who can write there could plant code this process would load. The directories
// above it must pass posix.hpp's trust rule too (owned by root or the current user, not writable
// by group or others unless sticky): whoever can rename the cache directory can swap in their
// own. Once checked, the directory is used by its resolved path, so swapping a symlink later
// does not redirect us.
//
// Layout (v1 names the format; a later format uses v2/ and never misreads v1 entries):
//
//   <dir>/v1/artifacts/<sha256(key)>/   one entry per directory:
//                           key          the full canonical key text
//                           meta         "fusebox-cache-entry 1\nkind artifact\nsize N\nsha256 H\n"
//                           artifact.so  the payload, dlopen'ed by path
//   <dir>/v1/blobs/<sha256(key)>/       the same, payload "blob" (autotune winners and such)
//   <dir>/v1/tmp/                       staging ("store-XXXXXX") and removal ("trash-XXXXXX")
//
// Publishing: an entry is written completely into a fresh mkdtemp directory under tmp/ (same
// file system), every file fsync'ed, the staging directory fsync'ed, then renamed to its final
// name with one rename(2). rename() of a directory onto an existing non-empty directory fails,
// so an entry appears all at once or not at all, and if another process published the same
// entry first, theirs is kept (after checking it; a bad one is replaced). Removal (corrupt
// entries, eviction) renames the entry into tmp/ first, then deletes it there, so no reader
// ever sees a half-deleted entry under a live name either.
//
// Lookup checks, before returning anything: the meta file parses; the stored key equals the
// requested key in full (not only the digest that named the directory); the payload is a
// regular file (not a symlink) of the recorded size whose SHA-256 matches. A failed check
// removes the entry and reports a miss with the reason. A hit touches the entry's mtime: that
// is the LRU clock. After each store, if the entries total more than the cap
// (FUSEBOX_CACHE_MAX_BYTES, default 1 GiB; suffixes K, M, G, T), the least recently used are
// evicted (never the entry just stored). Staging leftovers of crashed processes older than an
// hour are removed at the same time.
//
// Not covered: a path returned by lookup() can be evicted by another process before the caller
// dlopens it (dlopen then fails: treat that as a miss); eviction scans the whole cache on each
// store (O(entries), fine for thousands).
//
// Thread-safe: the object is immutable after construction and every operation is atomic on
// disk. Store failures (disk full, read-only) never throw: they warn once and return nullopt,
// and the caller keeps using its in-memory artifact.
//
// Depends on: the C++20 standard library, POSIX (stat, mkdir, rename, fsync, utimensat,
// getpwuid_r), fusebox/runtime/{hash,cache_key,posix,logs,counters}.hpp.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/runtime/cache_key.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/hash.hpp"
#include "fusebox/runtime/logs.hpp"
#include "fusebox/runtime/posix.hpp"

namespace fusebox::jit {

struct disk_cache_options {
  /// Empty: FUSEBOX_CACHE_DIR, else $XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox.
  std::filesystem::path directory = {};
  /// Empty: FUSEBOX_CACHE_MAX_BYTES, else 1 GiB.
  std::optional<std::uint64_t> max_bytes = {};
};

enum class disk_status {
  hit,
  absent,     // no entry under this key's name
  disabled,   // the cache directory was refused or could not be created
  corrupt,    // truncated payload, content hash mismatch, unreadable or malformed files (removed)
  wrong_key,  // an entry under this name holds a different full key (removed)
};

struct disk_lookup {
  std::optional<std::filesystem::path> path;  // set on a hit (artifacts)
  std::optional<std::string> bytes;           // set on a hit (blobs)
  disk_status status = disk_status::absent;
  std::string reason;                         // why it missed, for logs and reports
};

class disk_cache {
 public:
  static constexpr std::uint64_t default_max_bytes = std::uint64_t{1} << 30;

  explicit disk_cache(disk_cache_options options = {});

  /// The directory the environment selects (before any check); empty if there is none.
  static std::filesystem::path default_directory();

  bool enabled() const noexcept { return !root_.empty(); }
  /// Why the cache is disabled (empty when enabled).
  const std::string& disabled_reason() const noexcept { return refused_; }
  /// The resolved cache directory (empty when disabled).
  const std::filesystem::path& directory() const noexcept { return root_; }
  std::uint64_t max_bytes() const noexcept { return max_bytes_; }

  /// Where the entry for `key` lives (whether or not it exists).
  std::filesystem::path entry_directory(const cache_key& key, bool blob = false) const {
    return root_ / "v1" / (blob ? "blobs" : "artifacts") / key.digest();
  }

  // --- artifacts (shared objects, loaded by path) ----------------------------------------

  disk_lookup find(const cache_key& key) const { return find_entry(key, kind_artifact); }

  /// The checked path of the artifact stored under `key`, or nullopt (find() says why).
  std::optional<std::filesystem::path> lookup(const cache_key& key) const {
    return find(key).path;
  }

  /// Copies the file at `artifact` into the cache under `key`; returns the cached path, or
  /// nullopt when the cache is disabled or the store failed (warned).
  std::optional<std::filesystem::path> store(const cache_key& key,
                                             const std::filesystem::path& artifact) const {
    return store_entry(key, kind_artifact, payload_source{&artifact, {}});
  }

  /// As store(), from bytes in memory.
  std::optional<std::filesystem::path> store_bytes(const cache_key& key,
                                                   std::string_view bytes) const {
    return store_entry(key, kind_artifact, payload_source{nullptr, bytes});
  }

  // --- blobs (small records: autotune winners) -------------------------------------------

  bool store_blob(const cache_key& key, std::string_view bytes) const {
    return store_entry(key, kind_blob, payload_source{nullptr, bytes}).has_value();
  }

  std::optional<std::string> lookup_blob(const cache_key& key) const {
    return find_blob(key).bytes;
  }

  disk_lookup find_blob(const cache_key& key) const { return find_entry(key, kind_blob); }

  // --- maintenance ------------------------------------------------------------------------

  /// Total bytes of all entries (a scan).
  std::uint64_t size_bytes() const;

  /// Removes every entry (e.g. `fusebox --clear-cache`, tests).
  void clear() const {
    if (!enabled()) return;
    for (const auto& e : scan()) retire(e.path);
  }

 private:
  struct entry_kind {
    const char* directory;  // under v1/
    const char* payload;    // file name inside an entry
    const char* name;       // in meta and messages
    bool blob;              // lookups return the verified bytes rather than a path
  };
  static constexpr entry_kind kind_artifact{"artifacts", "artifact.so", "artifact", false};
  static constexpr entry_kind kind_blob{"blobs", "blob", "blob", true};

  static constexpr std::size_t max_key_bytes = std::size_t{64} << 20;
  static constexpr std::size_t max_meta_bytes = 4096;
  static constexpr std::size_t max_blob_bytes = std::size_t{256} << 20;
  static constexpr const char* meta_magic = "fusebox-cache-entry 1";

  struct payload_source {
    const std::filesystem::path* file;  // copy from this file, or
    std::string_view bytes;             // write these
  };

  struct scanned_entry {
    std::filesystem::path path;
    std::uint64_t bytes;
    timespec mtime;
  };

  // --- setup ------------------------------------------------------------------------------

  static std::uint64_t max_bytes_from_environment();

  /// "1073741824", "512M", "1G", "64KiB"
  static std::optional<std::uint64_t> parse_size(std::string_view text);

  /// Why `path` (after following a final symlink) is not a private directory, or nullopt.
  static std::optional<std::string> not_private(const std::filesystem::path& path);

  /// mkdir -p with mode 0700 for every directory it creates.
  static std::optional<std::string> make_directories(const std::filesystem::path& dir);

  /// Creates and checks the directory tree; sets root_ on success.
  std::optional<std::string> prepare(const std::filesystem::path& dir);

  void refuse(const std::filesystem::path& dir, const std::string& why);

  /// Warns the first time `topic` comes up in this process.
  static void warn_once(const std::string& topic, const std::string& message);

  // --- lookup -----------------------------------------------------------------------------

  disk_lookup find_entry(const cache_key& key, const entry_kind& kind) const;

  /// Checks one entry directory against `key`. For blobs, `blob` receives the verified bytes.
  static disk_lookup check_entry(const std::filesystem::path& dir, const cache_key& key,
                                 const entry_kind& kind, std::string* blob);

  static std::string make_meta(const entry_kind& kind, std::uint64_t size,
                               const std::string& sha);

  static bool parse_meta(std::string_view meta, const entry_kind& kind, std::uint64_t& size,
                         std::string& sha);

  // --- store ------------------------------------------------------------------------------

  std::optional<std::filesystem::path> store_entry(const cache_key& key, const entry_kind& kind,
                                                   const payload_source& source) const;

  /// Writes the payload file (new, fsync'ed); returns its size and SHA-256 (of the bytes
  /// written, so a source file changing under us cannot give a mismatched record).
  static std::pair<std::uint64_t, std::string> write_payload(const std::filesystem::path& path,
                                                             const payload_source& source);

  /// Takes an entry out of its live name at once (one rename into tmp/), then deletes it.
  void retire(const std::filesystem::path& entry) const;

  // --- size cap ---------------------------------------------------------------------------

  static bool is_digest_name(const std::string& name) {
    return name.size() == 64 && name.find_first_not_of("0123456789abcdef") == std::string::npos;
  }

  /// Calls fn(path) for each name in `dir`; entries vanishing meanwhile (another process
  /// evicting) end or skip the walk instead of throwing.
  template <class Fn>
  static void for_each_in(const std::filesystem::path& dir, Fn&& fn) {
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) fn(it->path());
  }

  std::vector<scanned_entry> scan() const;

  void remove_stale_staging() const;

  void enforce_cap(const std::filesystem::path& keep) const;

  std::filesystem::path root_;       // resolved and checked; empty when disabled
  std::string refused_;
  std::uint64_t max_bytes_ = default_max_bytes;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API disk_cache::disk_cache(disk_cache_options options) {
  max_bytes_ = options.max_bytes ? *options.max_bytes : max_bytes_from_environment();
  std::filesystem::path dir =
      options.directory.empty() ? default_directory() : options.directory;
  if (dir.empty()) {
    refuse(dir, "no cache directory: FUSEBOX_CACHE_DIR, XDG_CACHE_HOME and HOME are unset");
    return;
  }
  std::error_code ec;
  if (dir.is_relative()) dir = std::filesystem::absolute(dir, ec);
  if (auto why = prepare(dir)) refuse(dir, *why);
}

FUSEBOX_RUNTIME_API std::filesystem::path disk_cache::default_directory() {
  if (const char* env = std::getenv("FUSEBOX_CACHE_DIR"); env && *env) return env;
  if (const char* env = std::getenv("XDG_CACHE_HOME"); env && env[0] == '/')
    return std::filesystem::path(env) / "fusebox";  // XDG: relative values are ignored
  std::filesystem::path home;
  if (const char* env = std::getenv("HOME"); env && *env) {
    home = env;
  } else {
    std::vector<char> buffer(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (::getpwuid_r(::geteuid(), &pw, buffer.data(), buffer.size(), &found) == 0 && found &&
        found->pw_dir)
      home = found->pw_dir;
  }
  if (home.empty()) return {};
  return home / ".cache" / "fusebox";
}

FUSEBOX_RUNTIME_API std::uint64_t disk_cache::size_bytes() const {
  std::uint64_t total = 0;
  for (const auto& e : scan()) total += e.bytes;
  return total;
}

FUSEBOX_RUNTIME_API std::uint64_t disk_cache::max_bytes_from_environment() {
  const char* env = std::getenv("FUSEBOX_CACHE_MAX_BYTES");
  if (!env || !*env) return default_max_bytes;
  if (auto parsed = parse_size(env)) return *parsed;
  warn("FUSEBOX_CACHE_MAX_BYTES='" + std::string(env) +
       "' is not a size (bytes, or a number with K, M, G or T); using 1G");
  return default_max_bytes;
}

FUSEBOX_RUNTIME_API std::optional<std::uint64_t> disk_cache::parse_size(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end == text.data()) return std::nullopt;
  std::string_view suffix(end, static_cast<std::size_t>(text.data() + text.size() - end));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix.front()) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      case 'T': case 't': shift = 40; break;
      default: return std::nullopt;
    }
    suffix.remove_prefix(1);
    if (!(suffix.empty() || suffix == "B" || suffix == "iB")) return std::nullopt;
  }
  if (shift != 0 && value > (~std::uint64_t{0} >> shift)) return std::nullopt;
  return value << shift;
}

FUSEBOX_RUNTIME_API std::optional<std::string> disk_cache::not_private(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return detail::os_message("cannot stat", path, errno);
  const bool link = S_ISLNK(st.st_mode);
  if (link && ::stat(path.c_str(), &st) != 0)
    return detail::os_message("cannot follow the symlink", path, errno);
  const std::string what = "'" + path.string() + "'" + (link ? " (a symlink)" : "");
  if (!S_ISDIR(st.st_mode)) return what + " is not a directory";
  if (st.st_uid != ::geteuid())
    return what + " is owned by uid " + std::to_string(st.st_uid) +
           ", not by the current user (uid " + std::to_string(::geteuid()) + ")";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return what + " is writable by " +
           ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (mode " + mode + ")";
  }
  return std::nullopt;
}

FUSEBOX_RUNTIME_API std::optional<std::string> disk_cache::make_directories(const std::filesystem::path& dir) {
  std::filesystem::path prefix;
  for (const auto& part : dir) {
    prefix /= part;
    if (prefix == prefix.root_path()) continue;
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      // The umask may have removed bits we need; set exactly 0700 on what we created.
      if (::chmod(prefix.c_str(), 0700) != 0)
        return detail::os_message("cannot chmod", prefix, errno);
    } else if (errno != EEXIST) {
      return detail::os_message("cannot create directory", prefix, errno);
    }
  }
  return std::nullopt;
}

FUSEBOX_RUNTIME_API std::optional<std::string> disk_cache::prepare(const std::filesystem::path& dir) {
  if (auto why = make_directories(dir)) return why;
  if (auto why = not_private(dir)) return why;
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::canonical(dir, ec);
  if (ec) return "cannot resolve '" + dir.string() + "': " + ec.message();
  if (auto why = not_private(root)) return why;  // the target, by its resolved name
  if (auto why = detail::untrusted_directory(root.parent_path(), /*sticky_leaf=*/true))
    return "a directory above it is not safe: " + *why;
  for (const char* sub : {"v1", "v1/artifacts", "v1/blobs", "v1/tmp"}) {
    const auto path = root / sub;
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return detail::os_message("cannot create directory", path, errno);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || S_ISLNK(st.st_mode))
      return "'" + path.string() + "' is a symlink or unreadable";
    if (auto why = not_private(path)) return why;
  }
  root_ = root;
  return std::nullopt;
}

FUSEBOX_RUNTIME_API void disk_cache::refuse(const std::filesystem::path& dir, const std::string& why) {
  refused_ = why;
  root_.clear();
  warn_once("refused " + dir.string() + ": " + why, "disk cache disabled: " + why +
            ". Anyone who can write there could plant code that fusebox would load, so "
            "compiled kernels are cached in memory only. Fix: chmod 700 the directory, or set "
            "FUSEBOX_CACHE_DIR to a private directory" +
            (dir.empty() ? std::string() : " (was '" + dir.string() + "')"));
}

FUSEBOX_RUNTIME_API void disk_cache::warn_once(const std::string& topic, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> said;
  {
    std::lock_guard lock(mutex);
    if (!said.insert(topic).second) return;
  }
  warn(message);
}

FUSEBOX_RUNTIME_API disk_lookup disk_cache::find_entry(const cache_key& key, const entry_kind& kind) const {
  disk_lookup result;
  if (!enabled()) {
    result.status = disk_status::disabled;
    result.reason = "disk cache disabled: " + refused_;
    return result;
  }
  const std::string digest = key.digest();
  const auto dir = root_ / "v1" / kind.directory / digest;
  std::string bytes;
  result = check_entry(dir, key, kind, kind.blob ? &bytes : nullptr);
  const std::string label = std::string(kind.name) + " " + digest.substr(0, 16);
  if (result.status == disk_status::hit) {
    ::utimensat(AT_FDCWD, dir.c_str(), nullptr, 0);  // the LRU clock; failure is harmless
    counters().disk_hits.fetch_add(1, std::memory_order_relaxed);
    if (jit::enabled(log_category::cache)) log(log_category::cache, "disk hit: " + label);
    if (kind.blob)
      result.bytes = std::move(bytes);
    else
      result.path = dir / kind.payload;
    return result;
  }
  counters().disk_misses.fetch_add(1, std::memory_order_relaxed);
  if (result.status == disk_status::corrupt || result.status == disk_status::wrong_key) {
    retire(dir);
    result.reason += "; entry removed";
  }
  if (jit::enabled(log_category::cache))
    log(log_category::cache, "disk miss: " + label + ": " + result.reason);
  return result;
}

FUSEBOX_RUNTIME_API disk_lookup disk_cache::check_entry(const std::filesystem::path& dir, const cache_key& key,
                                                        const entry_kind& kind, std::string* blob) {
  disk_lookup r;
  const auto fail = [&](disk_status status, std::string why) {
    r.status = status;
    r.reason = std::move(why);
    return r;
  };
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return fail(disk_status::absent, "not cached");
    return fail(disk_status::corrupt, detail::os_message("cannot stat", dir, errno));
  }
  if (!S_ISDIR(st.st_mode)) return fail(disk_status::corrupt, "entry is not a directory");
  try {
    // meta: format, kind, size, content hash
    const std::string meta = detail::read_file(dir / "meta", max_meta_bytes);
    std::uint64_t size = 0;
    std::string sha;
    if (!parse_meta(meta, kind, size, sha))
      return fail(disk_status::corrupt, "malformed meta file");
    // the full key, not just the digest that named the directory
    const std::string stored = detail::read_file(dir / "key", max_key_bytes);
    if (stored != key.canonical)
      return fail(disk_status::wrong_key,
                  "the entry holds a different key (" + std::to_string(stored.size()) +
                      " bytes) under this key's name");
    // the payload: a regular file of the recorded size and content hash
    const auto payload = dir / kind.payload;
    detail::unique_fd fd = detail::open_fd(payload, O_RDONLY | O_NOFOLLOW);
    if (!fd) return fail(disk_status::corrupt, detail::os_message("cannot open", payload, errno));
    struct stat ps {};
    if (::fstat(fd.get(), &ps) != 0 || !S_ISREG(ps.st_mode))
      return fail(disk_status::corrupt, "payload is not a regular file");
    if (static_cast<std::uint64_t>(ps.st_size) != size)
      return fail(disk_status::corrupt, "truncated or resized payload: " +
                                            std::to_string(ps.st_size) + " bytes, expected " +
                                            std::to_string(size));
    sha256 hasher;
    if (blob) {
      *blob = detail::read_all(fd.get(), payload, max_blob_bytes);
      if (blob->size() != size) return fail(disk_status::corrupt, "payload changed size");
      hasher.update(*blob);
    } else {
      char buffer[1 << 16];
      std::uint64_t seen = 0;
      for (;;) {
        const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
        if (n < 0) {
          if (errno == EINTR) continue;
          return fail(disk_status::corrupt, detail::os_message("cannot read", payload, errno));
        }
        if (n == 0) break;
        hasher.update(buffer, static_cast<std::size_t>(n));
        seen += static_cast<std::uint64_t>(n);
      }
      if (seen != size) return fail(disk_status::corrupt, "payload changed size");
    }
    if (hex(hasher.finish()) != sha)
      return fail(disk_status::corrupt, "content hash mismatch (corrupt payload)");
  } catch (const io_error& e) {
    return fail(disk_status::corrupt, e.what());
  }
  r.status = disk_status::hit;
  return r;
}

FUSEBOX_RUNTIME_API std::string disk_cache::make_meta(const entry_kind& kind, std::uint64_t size,
                                                      const std::string& sha) {
  // Appended piece by piece: GCC 12 warns (-Warray-bounds, a false positive) on the chain of
  // operator+ temporaries this was, in every test that includes the disk cache.
  std::string meta(meta_magic);
  meta += "\nkind ";
  meta += kind.name;
  meta += "\nsize ";
  meta += std::to_string(size);
  meta += "\nsha256 ";
  meta += sha;
  meta += '\n';
  return meta;
}

FUSEBOX_RUNTIME_API bool disk_cache::parse_meta(std::string_view meta, const entry_kind& kind, std::uint64_t& size,
                                                std::string& sha) {
  // Exactly the four lines make_meta writes, in order.
  const auto take_line = [&](std::string_view prefix, std::string_view& value) {
    const std::size_t newline = meta.find('\n');
    if (newline == std::string_view::npos) return false;
    const std::string_view line = meta.substr(0, newline);
    meta.remove_prefix(newline + 1);
    if (line.substr(0, prefix.size()) != prefix) return false;
    value = line.substr(prefix.size());
    return true;
  };
  std::string_view magic, kind_name, size_text, sha_text;
  if (!take_line("", magic) || magic != meta_magic) return false;
  if (!take_line("kind ", kind_name) || kind_name != kind.name) return false;
  if (!take_line("size ", size_text) || !take_line("sha256 ", sha_text) || !meta.empty())
    return false;
  const auto [end, error] =
      std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
  if (error != std::errc{} || end != size_text.data() + size_text.size() || size_text.empty())
    return false;
  if (sha_text.size() != 64 || sha_text.find_first_not_of("0123456789abcdef") !=
                                   std::string_view::npos)
    return false;
  sha = sha_text;
  return true;
}

FUSEBOX_RUNTIME_API std::optional<std::filesystem::path> disk_cache::store_entry(const cache_key& key,
                                                                                 const entry_kind& kind,
                                                                                 const payload_source& source) const {
  if (!enabled()) return std::nullopt;
  const std::string digest = key.digest();
  const auto kind_dir = root_ / "v1" / kind.directory;
  const auto final_dir = kind_dir / digest;
  const std::string label = std::string(kind.name) + " " + digest.substr(0, 16);
  try {
    temp_directory stage(root_ / "v1" / "tmp", "store-");
    const auto [size, sha] = write_payload(stage.path() / kind.payload, source);
    detail::write_new_file(stage.path() / "key", key.canonical);
    detail::write_new_file(stage.path() / "meta", make_meta(kind, size, sha));
    detail::fsync_directory(stage.path());

    for (int attempt = 0;; ++attempt) {
      if (::rename(stage.path().c_str(), final_dir.c_str()) == 0) {
        stage.release();
        detail::fsync_directory(kind_dir);
        ::utimensat(AT_FDCWD, final_dir.c_str(), nullptr, 0);
        counters().disk_stores.fetch_add(1, std::memory_order_relaxed);
        if (jit::enabled(log_category::cache))
          log(log_category::cache,
              "disk store: " + label + " (" + std::to_string(size) + " bytes)");
        break;
      }
      if (errno != EEXIST && errno != ENOTEMPTY)
        detail::throw_io("cannot publish cache entry", final_dir);
      // Someone published this name first: keep theirs if it is good for this key.
      const disk_lookup theirs = check_entry(final_dir, key, kind, nullptr);
      if (theirs.status == disk_status::hit) {
        if (jit::enabled(log_category::cache))
          log(log_category::cache, "disk store: " + label + " already published; kept it");
        break;
      }
      if (attempt == 3)
        FUSEBOX_THROW(io_error("cannot publish cache entry '" + final_dir.string() +
                               "': it keeps being replaced (" + theirs.reason + ")"));
      if (jit::enabled(log_category::cache))
        log(log_category::cache,
            "disk store: " + label + ": replacing a bad entry (" + theirs.reason + ")");
      retire(final_dir);
    }
  } catch (const std::exception& e) {  // io_error, filesystem_error, bad_alloc
    warn_once("store failed in " + root_.string(),
              std::string("disk cache store failed (kernels stay cached in memory; later "
                          "failures are logged under FUSEBOX_LOGS=cache): ") +
                  e.what());
    if (jit::enabled(log_category::cache))
      log(log_category::cache, "disk store failed: " + label + ": " + e.what());
    return std::nullopt;
  }
  try {
    enforce_cap(final_dir);
  } catch (const std::exception& e) {  // the entry is stored; only the cap is late
    if (jit::enabled(log_category::cache))
      log(log_category::cache, std::string("disk eviction failed: ") + e.what());
  }
  return final_dir / kind.payload;
}

FUSEBOX_RUNTIME_API std::pair<std::uint64_t, std::string> disk_cache::write_payload(const std::filesystem::path& path,
                                                                                    const payload_source& source) {
  detail::unique_fd out =
      detail::open_fd(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (!out) detail::throw_io("cannot create", path);
  sha256 hasher;
  std::uint64_t size = 0;
  if (source.file) {
    detail::unique_fd in = detail::open_fd(*source.file, O_RDONLY);
    if (!in) detail::throw_io("cannot open", *source.file);
    char buffer[1 << 16];
    for (;;) {
      const ssize_t n = ::read(in.get(), buffer, sizeof buffer);
      if (n < 0) {
        if (errno == EINTR) continue;
        detail::throw_io("cannot read", *source.file);
      }
      if (n == 0) break;
      hasher.update(buffer, static_cast<std::size_t>(n));
      detail::write_all(out.get(), buffer, static_cast<std::size_t>(n), path);
      size += static_cast<std::uint64_t>(n);
    }
  } else {
    hasher.update(source.bytes);
    detail::write_all(out.get(), source.bytes.data(), source.bytes.size(), path);
    size = source.bytes.size();
  }
  detail::fsync_fd(out.get(), path);
  return {size, hex(hasher.finish())};
}

FUSEBOX_RUNTIME_API void disk_cache::retire(const std::filesystem::path& entry) const {
  try {
    temp_directory trash(root_ / "v1" / "tmp", "trash-");
    if (::rename(entry.c_str(), (trash.path() / "entry").c_str()) != 0) return;  // gone already
  } catch (const io_error&) {
    std::error_code ignored;  // no room even for a directory: delete in place
    std::filesystem::remove_all(entry, ignored);
  }
}

FUSEBOX_RUNTIME_API std::vector<disk_cache::scanned_entry> disk_cache::scan() const {
  std::vector<scanned_entry> out;
  if (!enabled()) return out;
  for (const char* sub : {kind_artifact.directory, kind_blob.directory}) {
    for_each_in(root_ / "v1" / sub, [&](const std::filesystem::path& entry) {
      if (!is_digest_name(entry.filename().string())) return;
      struct stat st {};
      if (::lstat(entry.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
      scanned_entry e{entry, 0, st.st_mtim};
      for_each_in(entry, [&](const std::filesystem::path& file) {
        struct stat fs {};
        if (::lstat(file.c_str(), &fs) == 0) e.bytes += static_cast<std::uint64_t>(fs.st_size);
      });
      out.push_back(std::move(e));
    });
  }
  return out;
}

FUSEBOX_RUNTIME_API void disk_cache::remove_stale_staging() const {
  const std::time_t cutoff = std::time(nullptr) - 3600;
  for_each_in(root_ / "v1" / "tmp", [&](const std::filesystem::path& item) {
    struct stat st {};
    if (::lstat(item.c_str(), &st) == 0 && st.st_mtim.tv_sec < cutoff) {
      std::error_code ignored;
      std::filesystem::remove_all(item, ignored);
    }
  });
}

FUSEBOX_RUNTIME_API void disk_cache::enforce_cap(const std::filesystem::path& keep) const {
  remove_stale_staging();
  auto entries = scan();
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(), [](const scanned_entry& a, const scanned_entry& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec < b.mtime.tv_sec;
    return a.mtime.tv_nsec < b.mtime.tv_nsec;
  });
  for (const auto& e : entries) {
    if (total <= max_bytes_) break;
    if (e.path == keep) continue;
    retire(e.path);
    total -= e.bytes;
    counters().evictions.fetch_add(1, std::memory_order_relaxed);
    if (jit::enabled(log_category::cache))
      log(log_category::cache, "disk evict: " + e.path.parent_path().filename().string() + " " +
                                   e.path.filename().string().substr(0, 16) + " (" +
                                   std::to_string(e.bytes) + " bytes, least recently used)");
  }
}
#endif

}  // namespace fusebox::jit
