// Tests for include/fusebox/profile.hpp: nothing is recorded while off; spans and instants from
// several threads are recorded while on; the Chrome trace is valid JSON (parsed back here with
// a small strict parser) whose strings decode to what was recorded; a static model's kernel spans
// carry its fused ops' names.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cctype>
#include <map>
#include <set>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "fusebox/fusebox.hpp"
#include "fusebox/profile.hpp"
#include "fusebox/runtime/posix.hpp"

#include "support/child.hpp"

namespace profile = fusebox::profile;

namespace {

// --- a strict, minimal JSON parser (RFC 8259), enough to check the trace -----------------

struct json;
using json_object = std::map<std::string, json>;
using json_array = std::vector<json>;
struct json {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<json_array>,
               std::shared_ptr<json_object>>
      value;
  const json_object& object() const { return *std::get<std::shared_ptr<json_object>>(value); }
  const json_array& array() const { return *std::get<std::shared_ptr<json_array>>(value); }
  const std::string& string() const { return std::get<std::string>(value); }
  double number() const { return std::get<double>(value); }
  const json& operator[](const std::string& key) const { return object().at(key); }
  bool has(const std::string& key) const { return object().count(key) != 0; }
};

class json_parser {
 public:
  explicit json_parser(std::string_view text) : s_(text) {}

  json parse() {
    json v = value();
    space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_));
  }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  char peek() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) return false;
    i_ += word.size();
    return true;
  }

  json value() {
    const char c = peek();
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return json{string()};
    if (literal("true")) return json{true};
    if (literal("false")) return json{false};
    if (literal("null")) return json{nullptr};
    return number();
  }

  json object() {
    expect('{');
    auto out = std::make_shared<json_object>();
    if (peek() == '}') {
      ++i_;
      return json{out};
    }
    for (;;) {
      if (peek() != '"') fail("expected a key");
      std::string key = string();
      expect(':');
      (*out)[key] = value();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return json{out};
    }
  }

  json array() {
    expect('[');
    auto out = std::make_shared<json_array>();
    if (peek() == ']') {
      ++i_;
      return json{out};
    }
    for (;;) {
      out->push_back(value());
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return json{out};
    }
  }

  json number() {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    const std::size_t digits = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ == digits) fail("bad value");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      const std::size_t fraction = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == fraction) fail("bad fraction");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    return json{std::stod(std::string(s_.substr(start, i_ - start)))};
  }

  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return out;
      if (c < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= s_.size()) fail("bad escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (i_ + 4 > s_.size()) fail("bad \\u escape");
          const std::uint32_t cp = static_cast<std::uint32_t>(
              std::stoul(std::string(s_.substr(i_, 4)), nullptr, 16));
          i_ += 4;
          put_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("profile: nothing is recorded while off", "[profile]") {
  profile::stop();
  profile::clear();
  { profile::scoped_span span("ignored", "test"); }
  profile::instant("ignored too");
  CHECK(profile::events().empty());
  CHECK_FALSE(profile::active());
}

TEST_CASE("profile: spans and instants from several threads make a valid Chrome trace",
          "[profile]") {
  const std::string tricky = "quote \" backslash \\ newline \n tab \t bell \x07 end";
  const std::string utf8 = "h\xc3\xa9llo \xe2\x86\x92 \xf0\x9f\x98\x80";  // héllo → 😀
  const std::string invalid = "bad \xff byte, lone \xc3, overlong \xc0\xaf";

  profile::start();
  CHECK(profile::active());
  {
    profile::scoped_span outer("compile W1c", "compile", "batch=64");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    profile::instant("disk hit", "cache", "digest 0123");
    profile::instant(tricky, "test");
    profile::instant(utf8, "test");
    profile::instant(invalid, "test");
    std::thread worker([] {
      profile::scoped_span span("kernel", "run");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    worker.join();
    outer.note("cache miss");
  }
  profile::stop();
  { profile::scoped_span late("after stop", "test"); }

  fusebox::jit::temp_directory scratch(fusebox::jit::detail::temp_root(), "fusebox-test-trace-");
  const auto path = scratch.path() / "trace.json";
  profile::write_chrome_trace(path);
  const std::string text = slurp(path);
  json trace;
  REQUIRE_NOTHROW(trace = json_parser(text).parse());
  const auto& events = trace["traceEvents"].array();
  std::map<std::string, const json*> by_name;
  std::set<double> threads;
  for (const auto& e : events) {
    REQUIRE(e.has("name"));
    REQUIRE(e.has("ph"));
    REQUIRE(e.has("pid"));
    REQUIRE(e.has("tid"));
    by_name[e["name"].string()] = &e;
    if (e["ph"].string() != "M") threads.insert(e["tid"].number());
  }
  CHECK(events.size() == 1 + 6);  // process name + 2 spans + 4 instants; not "after stop"
  CHECK(by_name.count("after stop") == 0);
  CHECK(threads.size() == 2);

  const json& outer = *by_name.at("compile W1c");
  CHECK(outer["ph"].string() == "X");
  CHECK(outer["cat"].string() == "compile");
  CHECK(outer["dur"].number() >= 2000);  // microseconds
  CHECK(outer["args"]["detail"].string() == "batch=64; cache miss");
  const json& kernel = *by_name.at("kernel");
  CHECK(kernel["ts"].number() >= outer["ts"].number());
  CHECK(kernel["ts"].number() + kernel["dur"].number() <=
        outer["ts"].number() + outer["dur"].number() + 1);
  CHECK(by_name.at("disk hit")->operator[]("ph").string() == "i");
  CHECK(by_name.at("disk hit")->operator[]("args")["detail"].string() == "digest 0123");

  // Strings decode to exactly what was recorded; invalid UTF-8 became U+FFFD.
  CHECK(by_name.count(tricky) == 1);
  CHECK(by_name.count(utf8) == 1);
  CHECK(by_name.count("bad \xef\xbf\xbd byte, lone \xef\xbf\xbd, overlong "
                      "\xef\xbf\xbd\xef\xbf\xbd") == 1);
  CHECK(trace["otherData"]["dropped_events"].number() == 0);
}

TEST_CASE("profile: start() begins a new session; spans do not cross sessions", "[profile]") {
  profile::start();
  profile::instant("first session");
  auto* straddling = new profile::scoped_span("straddling");
  profile::start();  // drops "first session"; the open span belongs to the old session
  delete straddling;
  profile::instant("second session");
  profile::stop();
  const auto recorded = profile::events();
  REQUIRE(recorded.size() == 1);
  CHECK(recorded[0].name == "second session");
  CHECK(recorded[0].instant);
  profile::clear();
  CHECK(profile::events().empty());
}

TEST_CASE("profile: an unwritable trace path is an error naming it", "[profile]") {
  CHECK_THROWS_AS(profile::write_chrome_trace("/nonexistent-dir/trace.json"), fusebox::error);
  CHECK_THROWS_WITH(profile::write_chrome_trace("/nonexistent-dir/trace.json"),
                    Catch::Contains("/nonexistent-dir/trace.json"));
}

// ---- static kernels named by their fused ops (issue 20, item 15) ----------------------------------

namespace {
std::vector<std::string> kernel_span_names() {
  std::vector<std::string> names;
  for (const auto& e : profile::events())
    if (!e.instant && e.category == "kernel") names.push_back(e.name);
  return names;
}
}  // namespace

TEST_CASE("profile: a static model's kernel spans are named by their fused ops, as explain() lists them",
          "[profile]") {
  namespace fb = fusebox;
  fb::tensor<float, fb::shape<24, 40>> x;
  fb::tensor<float, fb::shape<40, 16>> w;
  fb::tensor<float, fb::shape<16>> b;
  x.fill_random(11, -1.0f, 1.0f);
  w.fill_random(12, -1.0f, 1.0f);
  b.fill_random(13, -1.0f, 1.0f);
  auto mlp = [](auto x, auto w, auto b) { return fb::softmax(fb::relu(fb::matmul(x, w) + b)); };
  auto f = fb::compile(mlp);
  (void)f(x, w, b);  // warm: arena allocated
  profile::start();
  const auto y = f(x, w, b);
  profile::stop();
  const auto names = kernel_span_names();
  const std::string plan = fb::explain_text(mlp, x, w, b);
  INFO(plan);
  REQUIRE(names.size() == 2);
  CHECK(names[0].rfind("matmul", 0) == 0);  // "matmul", or with an epilogue: "matmul + epilogue(...)"
  for (const char* op : {"relu", "exp", "sum", "div"})  // the row kernel: (add, relu,) softmax's ops
    CHECK(names[1].find(op) != std::string::npos);
  for (std::size_t k = 0; k < names.size(); ++k)  // the same words as explain()'s kernel lines
    CHECK(plan.find("] " + names[k] + "\n") != std::string::npos);
  for (const auto& e : profile::events())
    if (e.category == "kernel") CHECK((e.detail == "matmul" || e.detail == "rows"));  // the kind, kept
  // The values: softmax over relu(x w + b), against a double reference.
  for (std::size_t r = 0; r < 24; ++r) {
    double row[16], m = 0, s = 0;
    for (std::size_t c = 0; c < 16; ++c) {
      double acc = b.flat(c);
      for (std::size_t k = 0; k < 40; ++k) acc += double(x.flat(r * 40 + k)) * w.flat(k * 16 + c);
      row[c] = std::max(acc, 0.0);
      m = std::max(m, row[c]);
    }
    for (double& v : row) s += (v = std::exp(v - m));
    for (std::size_t c = 0; c < 16; ++c) {
      INFO("row " << r << " column " << c);
      REQUIRE(std::fabs(y.flat(r * 16 + c) - row[c] / s) <= 1e-5 * (row[c] / s) + 1e-7);
    }
  }
  // Eager ops are named by their op too.
  profile::start();
  (void)fb::eager(mlp)(x, w, b);
  profile::stop();
  const auto eager_names = kernel_span_names();
  CHECK(std::find(eager_names.begin(), eager_names.end(), "relu") != eager_names.end());
  CHECK(std::find(eager_names.begin(), eager_names.end(), "rows") == eager_names.end());
}

// Run by the next test in a fresh process with a fresh cache directory (hidden: "[.]"): its first
// JIT compile builds the precompiled prelude, once per cache directory and compiler.
TEST_CASE("profile: prelude child", "[.][profile-prelude-child]") {
  namespace fb = fusebox;
  fb::tensor<float, fb::shape<fb::dyn, 24>> x(5);
  x.fill_random(21, -1.0f, 1.0f);
  auto f = fb::compile([](auto x) { return fb::exp(x) * 2.0; });
  profile::start();
  const auto y = f(x);
  profile::stop();
  for (std::size_t i = 0; i < y.size(); ++i) {
    INFO("element " << i);
    REQUIRE(y.flat(i) == Approx(2.0 * std::exp(double(x.flat(i)))).epsilon(1e-6));
  }
  std::size_t builds = 0;
  for (const auto& e : profile::events())
    if (e.name == profile::prelude_build_name) {
      ++builds;
      CHECK(e.category == "compile");
      CHECK(e.duration_us > 0);
      CHECK(e.detail.find("prelude.hpp.gch") != std::string::npos);
    }
  CHECK(builds == 1);
}

TEST_CASE("profile: the JIT's one-off prelude build is a span of its own", "[profile]") {
  fusebox::jit::temp_directory scratch(fusebox::jit::detail::temp_root(), "fusebox-test-prelude-");
  const auto output = scratch.path() / "child.txt";
  const auto cache = scratch.path() / "cache";
  std::filesystem::create_directory(cache);
  std::filesystem::permissions(cache, std::filesystem::perms::owner_all);
  auto env = fbt::environment_without({"FUSEBOX_CACHE_DIR", "FUSEBOX_JIT_PCH"});
  env.push_back("FUSEBOX_CACHE_DIR=" + cache.string());
  const auto child = fbt::run_self("[profile-prelude-child]", env, output);
  const std::string& text = child.text;
  INFO(text);
  CHECK(child.passed);
  CHECK(text.find("All tests passed") != std::string::npos);
}
