// fusebox/runtime/posix.hpp: the few POSIX file operations the JIT's disk cache and host compiler
// share: an owning file descriptor, whole-buffer reads and writes that survive EINTR and short
// counts, fsync of a file's directory, a private temporary directory (mkdtemp, 0700, owner
// checked) that removes itself, and the trust rule for paths (`untrusted_directory`,
// `untrusted_tree`). Errors are `fusebox::jit::io_error` naming the operation, the path and
// strerror(errno).
//
// The trust rule: what fusebox compiles, includes or loads must not come from a path that a user
// other than root and the current one can change. A directory passes when it, and every directory
// above it up to /, is owned by root or the current user and is not writable by group or others.
// One exception, sound because of the sticky bit: an ancestor that others may write (/tmp, mode
// 1777) passes when it is sticky, since then no one else can rename or delete the entry below it
// on our path (which the walk checks is ours or root's). The checks run on the resolved path
// (symlinks followed), and callers use that resolved path from then on.
//
// Depends on: the C++20 standard library, POSIX (open, read, write, fsync, mkdtemp, lstat), and
// fusebox/core/errors.hpp.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

namespace fusebox::jit {

/// A file-system operation failed; what() names the operation, the path and the OS reason.
struct io_error : fusebox::error {
  using fusebox::error::error;
};

namespace detail {

inline std::string os_message(std::string_view what, const std::filesystem::path& path, int err) {
  return std::string(what) + " '" + path.string() + "': " + std::strerror(err);
}

[[noreturn]] inline void throw_io(std::string_view what, const std::filesystem::path& path,
                                  int err = errno) {
  FUSEBOX_THROW(io_error(os_message(what, path, err)));
}

/// An owning file descriptor.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

/// open(2) with O_CLOEXEC, retried on EINTR; an invalid unique_fd on failure (errno set).
FUSEBOX_RUNTIME_API unique_fd open_fd(const std::filesystem::path& path, int flags, mode_t mode = 0600);

FUSEBOX_RUNTIME_API void write_all(int fd, const void* data, std::size_t size,
                                   const std::filesystem::path& path);

/// Reads until end of file; throws if the file holds more than `limit` bytes (a cache file
/// that large is not one of ours, and must not exhaust memory).
FUSEBOX_RUNTIME_API std::string read_all(int fd, const std::filesystem::path& path, std::size_t limit);

/// The whole content of a regular file (not following a final symlink).
FUSEBOX_RUNTIME_API std::string read_file(const std::filesystem::path& path, std::size_t limit);

inline void fsync_fd(int fd, const std::filesystem::path& path) {
  while (::fsync(fd) != 0)
    if (errno != EINTR) throw_io("cannot fsync", path);
}

/// Makes a rename or a file creation inside `dir` durable.
FUSEBOX_RUNTIME_API void fsync_directory(const std::filesystem::path& dir);

/// Writes `bytes` to a new file (O_EXCL: never through an existing file or link) and fsyncs it.
FUSEBOX_RUNTIME_API void write_new_file(const std::filesystem::path& path, std::string_view bytes);

/// The directory for scratch files: $TMPDIR if it is an absolute path, else /tmp.
FUSEBOX_RUNTIME_API std::filesystem::path temp_root();

/// "mode 0777"
FUSEBOX_RUNTIME_API std::string mode_text(mode_t mode);

/// Why a user other than root and the current one could change the file or directory `st`
/// describes (owner, then group/other write bits), or nullopt. `sticky_ok`: a sticky directory
/// that others may write passes (see the trust rule at the top).
FUSEBOX_RUNTIME_API std::optional<std::string> foreign_writable(const std::filesystem::path& path,
                                                                const struct stat& st, bool sticky_ok);

/// Why the directory `dir` could be changed by another user (the trust rule at the top), or
/// nullopt. `sticky_leaf`: `dir` itself may be a sticky directory others write (a temp root
/// that we only create fresh private directories in); an include directory may not.
FUSEBOX_RUNTIME_API std::optional<std::string> untrusted_directory(const std::filesystem::path& dir,
                                                                   bool sticky_leaf = false);

/// As untrusted_directory, and every file and directory below `dir` too (a header anyone may
/// edit is as bad as a directory anyone may write). A symlink inside is checked where it leads:
/// the target and the directories above it (and, for a directory, its tree, `depth` levels of
/// such links at most).
FUSEBOX_RUNTIME_API std::optional<std::string> untrusted_tree(const std::filesystem::path& dir, int depth = 8);

}  // namespace detail

/// A fresh private directory (mkdtemp: unique name, mode 0700), removed with everything in it
/// when this object dies, unless release()d.
class temp_directory {
 public:
  /// Creates `<parent>/<prefix>XXXXXX`.
  explicit temp_directory(const std::filesystem::path& parent = detail::temp_root(),
                          std::string_view prefix = "fusebox-");
  temp_directory(temp_directory&& other) noexcept : path_(std::move(other.path_)) {
    other.path_.clear();
  }
  temp_directory& operator=(temp_directory&& other) noexcept;
  temp_directory(const temp_directory&) = delete;
  temp_directory& operator=(const temp_directory&) = delete;
  ~temp_directory() { remove(); }

  const std::filesystem::path& path() const noexcept { return path_; }

  /// Keep the directory (it was renamed elsewhere, or the caller owns it now).
  std::filesystem::path release() noexcept { return std::exchange(path_, {}); }

 private:
  void remove() noexcept;

  std::filesystem::path path_;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
namespace detail {

FUSEBOX_RUNTIME_API unique_fd open_fd(const std::filesystem::path& path, int flags, mode_t mode) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return unique_fd(fd);
}

FUSEBOX_RUNTIME_API void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (size != 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot write", path);
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

FUSEBOX_RUNTIME_API std::string read_all(int fd, const std::filesystem::path& path, std::size_t limit) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot read", path);
    }
    if (n == 0) return out;
    if (out.size() + static_cast<std::size_t>(n) > limit)
      FUSEBOX_THROW(io_error("file '" + path.string() + "' is larger than " + std::to_string(limit) +
                             " bytes"));
    out.append(buffer, static_cast<std::size_t>(n));
  }
}

FUSEBOX_RUNTIME_API std::string read_file(const std::filesystem::path& path, std::size_t limit) {
  unique_fd fd = open_fd(path, O_RDONLY | O_NOFOLLOW);
  if (!fd) throw_io("cannot open", path);
  return read_all(fd.get(), path, limit);
}

FUSEBOX_RUNTIME_API void fsync_directory(const std::filesystem::path& dir) {
  unique_fd fd = open_fd(dir, O_RDONLY | O_DIRECTORY);
  if (!fd) throw_io("cannot open directory", dir);
  fsync_fd(fd.get(), dir);
}

FUSEBOX_RUNTIME_API void write_new_file(const std::filesystem::path& path, std::string_view bytes) {
  unique_fd fd = open_fd(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (!fd) throw_io("cannot create", path);
  write_all(fd.get(), bytes.data(), bytes.size(), path);
  fsync_fd(fd.get(), path);
}

FUSEBOX_RUNTIME_API std::filesystem::path temp_root() {
  const char* env = std::getenv("TMPDIR");
  if (env && env[0] == '/') return env;
  return "/tmp";
}

FUSEBOX_RUNTIME_API std::string mode_text(mode_t mode) {
  char text[16];
  std::snprintf(text, sizeof text, "mode %04o", static_cast<unsigned>(mode & 07777));
  return text;
}

FUSEBOX_RUNTIME_API std::optional<std::string> foreign_writable(const std::filesystem::path& path,
                                                                const struct stat& st, bool sticky_ok) {
  if (st.st_uid != 0 && st.st_uid != ::geteuid())
    return "'" + path.string() + "' is owned by uid " + std::to_string(st.st_uid) +
           " (neither root nor the current user, uid " + std::to_string(::geteuid()) + ")";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
      !(sticky_ok && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) != 0))
    return "'" + path.string() + "' is writable by " +
           ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (" + mode_text(st.st_mode) + ")";
  return std::nullopt;
}

FUSEBOX_RUNTIME_API std::optional<std::string> untrusted_directory(const std::filesystem::path& dir, bool sticky_leaf) {
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::canonical(dir, ec);
  if (ec) return "cannot resolve '" + dir.string() + "': " + ec.message();
  bool leaf = true;
  for (std::filesystem::path p = resolved;; p = p.parent_path()) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return os_message("cannot stat", p, errno);
    if (!S_ISDIR(st.st_mode)) return "'" + p.string() + "' is not a directory";
    if (auto why = foreign_writable(p, st, !leaf || sticky_leaf))
      return *why + (p == resolved ? std::string() : ", above '" + resolved.string() + "'");
    leaf = false;
    if (p == p.root_path()) return std::nullopt;
  }
}

FUSEBOX_RUNTIME_API std::optional<std::string> untrusted_tree(const std::filesystem::path& dir, int depth) {
  if (auto why = untrusted_directory(dir)) return why;
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::canonical(dir, ec);
  if (ec) return "cannot resolve '" + dir.string() + "': " + ec.message();
  std::filesystem::recursive_directory_iterator it(resolved, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path& p = it->path();
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return os_message("cannot stat", p, errno);
    if (S_ISLNK(st.st_mode)) {
      const std::filesystem::path target = std::filesystem::canonical(p, ec);
      if (ec) continue;  // dangling: the compiler cannot read through it either
      struct stat ts {};
      if (::stat(target.c_str(), &ts) != 0) continue;
      if (S_ISDIR(ts.st_mode)) {
        if (depth == 0) return "'" + p.string() + "': too many levels of directory symlinks";
        if (auto why = untrusted_tree(target, depth - 1)) return *why + " (through '" + p.string() + "')";
      } else {
        if (auto why = untrusted_directory(target.parent_path()))
          return *why + " (through '" + p.string() + "')";
        if (auto why = foreign_writable(target, ts, false)) return *why + " (through '" + p.string() + "')";
      }
      continue;
    }
    if (auto why = foreign_writable(p, st, false)) return why;
  }
  if (ec) return "cannot list '" + resolved.string() + "': " + ec.message();
  return std::nullopt;
}

}  // namespace detail

FUSEBOX_RUNTIME_API temp_directory::temp_directory(const std::filesystem::path& parent, std::string_view prefix) {
  std::string pattern = (parent / (std::string(prefix) + "XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr)
    detail::throw_io("cannot create a temporary directory", pattern);
  path_ = buffer.data();
  // mkdtemp made it 0700 less the umask; make it exactly 0700, and check that it is the fresh
  // directory of ours it should be before anything is written into it.
  struct stat st {};
  if (::chmod(path_.c_str(), 0700) != 0 || ::lstat(path_.c_str(), &st) != 0) {
    const int err = errno;
    remove();
    detail::throw_io("cannot secure the temporary directory", buffer.data(), err);
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    const std::filesystem::path bad = std::exchange(path_, {});  // not ours: never remove it
    FUSEBOX_THROW(io_error("temporary directory '" + bad.string() + "' is not a private directory of "
                           "the current user after mkdtemp; refusing to use it"));
  }
}

FUSEBOX_RUNTIME_API temp_directory& temp_directory::operator=(temp_directory&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

FUSEBOX_RUNTIME_API void temp_directory::remove() noexcept {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
  path_.clear();
}
#endif

}  // namespace fusebox::jit
