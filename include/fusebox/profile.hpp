// fusebox/profile.hpp: `fusebox::profile`, a recorder of what the library spends time on (JIT
// compiles, cache hits, kernel runs), written as a Chrome trace JSON file that Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   fusebox::profile::start();                       // begin recording (drops earlier events)
//   { fusebox::profile::scoped_span s("matmul", "kernel"); ... }  // a span: name, category,
//                                                    //   start, duration, thread
//   fusebox::profile::instant("disk hit", "cache");  // a point event
//   fusebox::profile::kernel_name_scope n(name);     // the next "kernel" span is called `name`
//   fusebox::profile::stop();
//   fusebox::profile::write_chrome_trace("trace.json");
//
// Off by default, and cheap when off: a span or an instant is one relaxed atomic load and
// nothing else (no clock read, no allocation). When on, events go into one mutex-protected
// list, bounded (max_events; later events are counted as dropped), which suits events of
// kernel granularity (microseconds and up), not per-element tracing. A span is recorded only if
// recording was on when it began and is still on, in the same session, when it ends.
//
// Output: {"traceEvents":[...],"displayTimeUnit":"ms", ...}, with complete events ("ph":"X",
// "ts" and "dur" in microseconds since start()) and instant events ("ph":"i"), the process id
// and a small per-thread id. Strings are escaped for JSON, and bytes that are not valid UTF-8
// become U+FFFD, so the file always parses.
//
// Depends on: the C++20 standard library, POSIX getpid, fusebox/core/errors.hpp, fusebox/core/lock.hpp.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/lock.hpp"

namespace fusebox::profile {

struct event {
  std::string name;
  std::string category;
  std::string detail;    // free text shown under "args" (shapes, cache key digest)
  double start_us = 0;   // since start()
  double duration_us = 0;
  std::uint32_t thread = 0;
  bool instant = false;
};

/// Events kept per session; later ones are counted in dropped().
inline constexpr std::size_t max_events = std::size_t{1} << 20;

namespace detail {

using clock = std::chrono::steady_clock;

/// Whether recording is on. Kept apart from the recorder, which is made on first use: every
/// compiled call asks, and a program that never profiles must not allocate for the answer (edge
/// builds allocate nothing after start, issue 23).
inline std::atomic<bool> recording{false};

struct recorder {
  std::atomic<std::uint64_t> session{0};  // bumped by start(): spans never cross sessions
  ::fusebox::detail::state_mutex mutex;  // guards everything below (nothing to guard without threads)
  clock::time_point epoch{};
  std::vector<event> events;
  std::uint64_t dropped = 0;
};

inline recorder& state() {
  static recorder* r = new recorder;  // never destroyed: spans may end during static teardown
  return *r;
}

inline std::uint32_t thread_number() {
  static std::atomic<std::uint32_t> next{1};
  thread_local const std::uint32_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

inline double micros(clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

/// Appends `text` as a JSON string literal (with quotes).
inline void append_json_string(std::string& out, std::string_view text) {
  static constexpr char digits[] = "0123456789abcdef";
  out.push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7f) {
            out += "\\u00";
            out.push_back(digits[c >> 4]);
            out.push_back(digits[c & 15]);
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      ++p;
      continue;
    }
    // A multi-byte UTF-8 sequence: copy it if well-formed (no overlongs, no surrogates, at most
    // U+10FFFF), else write U+FFFD for the first byte and resynchronise.
    std::size_t length = 0;
    std::uint32_t min = 0, cp = 0;
    if ((c & 0xe0) == 0xc0) {
      length = 2;
      min = 0x80;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      length = 3;
      min = 0x800;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      length = 4;
      min = 0x10000;
      cp = c & 0x07;
    }
    bool ok = length != 0 && static_cast<std::size_t>(end - p) >= length;
    for (std::size_t i = 1; ok && i < length; ++i) {
      if ((p[i] & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (ok && cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff)) {
      out.append(reinterpret_cast<const char*>(p), length);
      p += length;
    } else {
      out += "\\ufffd";
      ++p;
    }
  }
  out.push_back('"');
}

inline void append_number(std::string& out, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f", value);
  out += buffer;
}

}  // namespace detail

/// Begins a recording session, dropping the events of any earlier one.
inline void start() {
  auto& r = detail::state();
  ::fusebox::detail::state_lock lock(r.mutex);
  r.events.clear();
  r.dropped = 0;
  r.epoch = detail::clock::now();
  r.session.fetch_add(1, std::memory_order_relaxed);
  detail::recording.store(true, std::memory_order_release);
}

/// Stops recording; the events stay until the next start() or clear().
inline void stop() { detail::recording.store(false, std::memory_order_release); }

inline bool active() noexcept {
  return detail::recording.load(std::memory_order_relaxed);
}

/// Drops every recorded event (recording state unchanged).
inline void clear() {
  auto& r = detail::state();
  ::fusebox::detail::state_lock lock(r.mutex);
  r.events.clear();
  r.dropped = 0;
}

/// A copy of the events recorded so far.
inline std::vector<event> events() {
  auto& r = detail::state();
  ::fusebox::detail::state_lock lock(r.mutex);
  return r.events;
}

inline std::uint64_t dropped() {
  auto& r = detail::state();
  ::fusebox::detail::state_lock lock(r.mutex);
  return r.dropped;
}

/// A point event ("disk hit", "guard failed").
inline void instant(std::string_view name, std::string_view category = "fusebox",
                    std::string_view info = {}) {
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  auto& r = detail::state();
  const auto now = detail::clock::now();
  event e{std::string(name), std::string(category), std::string(info), 0, 0,
          detail::thread_number(), true};
  ::fusebox::detail::state_lock lock(r.mutex);
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  if (r.events.size() >= max_events) {
    ++r.dropped;
    return;
  }
  e.start_us = detail::micros(now - r.epoch);
  r.events.push_back(std::move(e));
}

/// Records a span whose duration was measured elsewhere (a kernel's device time from CUDA
/// events): it ends now and lasted `duration_us`.
inline void add_span(std::string_view name, std::string_view category, double duration_us, std::string_view info = {}) {
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  auto& r = detail::state();
  const auto now = detail::clock::now();
  ::fusebox::detail::state_lock lock(r.mutex);
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  if (r.events.size() >= max_events) {
    ++r.dropped;
    return;
  }
  r.events.push_back(event{std::string(name), std::string(category), std::string(info),
                           detail::micros(now - r.epoch) - duration_us, duration_us, detail::thread_number(), false});
}

/// Device timing: while on (and recording), each CUDA kernel, cuBLASLt call and copy of a
/// compiled call that runs outside a CUDA graph is bracketed by events, and the call waits for
/// its work and records one "device" span per step with its time on the GPU. It serialises the
/// host with the device, so it is for finding where the time goes, not for timing throughput.
inline std::atomic<bool>& device_timing_flag() {
  static std::atomic<bool> on{false};
  return on;
}
/// `repeats` > 1 queues each step that many times back to back and records the mean: the GPU
/// then waits less on the host between launches, so short kernels are timed closer to their own
/// time (every step of a compiled call may be repeated: each writes only its own outputs).
inline std::atomic<int>& device_timing_repeats() {
  static std::atomic<int> n{1};
  return n;
}
inline void set_device_timing(bool on, int repeats = 1) {
  device_timing_repeats().store(repeats < 1 ? 1 : repeats, std::memory_order_relaxed);
  device_timing_flag().store(on, std::memory_order_relaxed);
}
inline bool device_timing() noexcept {
  return device_timing_flag().load(std::memory_order_relaxed) && active();
}

namespace detail {
/// The name kernel_name_scope gives the next "kernel" span of this thread (null: none).
inline const std::string*& pending_kernel_name() noexcept {
  thread_local const std::string* name = nullptr;
  return name;
}
}  // namespace detail

/// Names the next span of category "kernel" that this thread opens while the scope lives: the
/// static executor (backend/cpu/executor.hpp) names its spans by kernel kind ("rows", "matmul"); the caller
/// that runs it (backend/cpu/invoke.hpp) knows the kernel's fused ops and names the span by them, as
/// explain() lists them. The executor's name goes into the span's detail. One span takes the name
/// (kernels run inside an opaque() user function keep theirs).
class kernel_name_scope {
 public:
  explicit kernel_name_scope(const std::string& name) noexcept { detail::pending_kernel_name() = &name; }
  kernel_name_scope(const kernel_name_scope&) = delete;
  kernel_name_scope& operator=(const kernel_name_scope&) = delete;
  ~kernel_name_scope() { detail::pending_kernel_name() = nullptr; }
};

/// Records the time from construction to destruction as one span. Names are copied only when
/// recording is on.
class scoped_span {
 public:
  explicit scoped_span(std::string_view name, std::string_view category = "fusebox",
                       std::string_view info = {}) {
    if (!detail::recording.load(std::memory_order_relaxed)) return;
    session_ = detail::state().session.load(std::memory_order_relaxed);
    name_ = name;
    category_ = category;
    detail_ = info;
    if (const std::string*& given = detail::pending_kernel_name(); given && category == "kernel") {
      detail_ = std::string(name) + (info.empty() ? "" : "; ") + std::string(info);
      name_ = *given;
      given = nullptr;
    }
    begin_ = detail::clock::now();
    on_ = true;
  }
  scoped_span(const scoped_span&) = delete;
  scoped_span& operator=(const scoped_span&) = delete;

  /// Adds text to the span's "detail" argument (known only at the end: "cache hit").
  void note(std::string_view text) {
    if (!on_) return;
    if (!detail_.empty()) detail_ += "; ";
    detail_ += text;
  }

  ~scoped_span() {
    if (!on_) return;
    const auto end = detail::clock::now();
    auto& r = detail::state();
    ::fusebox::detail::state_lock lock(r.mutex);
    if (!detail::recording.load(std::memory_order_relaxed) ||
        r.session.load(std::memory_order_relaxed) != session_)
      return;
    if (r.events.size() >= max_events) {
      ++r.dropped;
      return;
    }
    r.events.push_back(event{std::move(name_), std::move(category_), std::move(detail_),
                             detail::micros(begin_ - r.epoch), detail::micros(end - begin_),
                             detail::thread_number(), false});
  }

 private:
  bool on_ = false;
  std::uint64_t session_ = 0;
  detail::clock::time_point begin_{};
  std::string name_, category_, detail_;
};

/// The span of the JIT's one-off build of its precompiled kernel prelude (runtime/kernel_store.hpp):
/// seconds once per cache directory and compiler, which would otherwise show as an unexplained gap
/// before the first kernels compile. `where` is the precompiled header's path.
inline constexpr std::string_view prelude_build_name = "precompiled prelude build";
inline scoped_span prelude_build_span(std::string_view where) {
  return scoped_span(prelude_build_name, "compile", where);
}

/// The recorded events as Chrome trace JSON.
inline std::string chrome_trace_json() {
  const auto recorded = events();
  const std::uint64_t lost = dropped();
  const long pid = static_cast<long>(::getpid());
  std::string out = "{\"traceEvents\":[\n";
  // Metadata first, so the viewer names the process.
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":0,\"args\":{\"name\":\"fusebox\"}}";
  for (const auto& e : recorded) {
    out += ",\n{\"name\":";
    detail::append_json_string(out, e.name);
    out += ",\"cat\":";
    detail::append_json_string(out, e.category);
    out += e.instant ? ",\"ph\":\"i\",\"s\":\"t\"" : ",\"ph\":\"X\"";
    out += ",\"ts\":";
    detail::append_number(out, e.start_us);
    if (!e.instant) {
      out += ",\"dur\":";
      detail::append_number(out, e.duration_us);
    }
    out += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(e.thread);
    if (!e.detail.empty()) {
      out += ",\"args\":{\"detail\":";
      detail::append_json_string(out, e.detail);
      out += "}";
    }
    out += "}";
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"fusebox\",\"dropped_events\":" +
         std::to_string(lost) + "}}\n";
  return out;
}

/// Writes chrome_trace_json() to `path`; throws fusebox::error naming the path on failure. A
/// std::filesystem::path converts to std::string here, so this header does not need
/// <filesystem> (about a tenth of what <fusebox/cpu.hpp> costs to parse; issue 22).
inline void write_chrome_trace(const std::string& path) {
  const std::string json = chrome_trace_json();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file)
    FUSEBOX_THROW(fusebox::error("fusebox::profile: cannot write '" + path +
                                 "': " + std::strerror(errno)));
  const bool written = std::fwrite(json.data(), 1, json.size(), file) == json.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed)
    FUSEBOX_THROW(fusebox::error("fusebox::profile: cannot write '" + path +
                                 "': " + std::strerror(errno)));
}

}  // namespace fusebox::profile
