// backend/emitter.hpp: a small structured emitter for kernel bodies. A body is a list of named values
// (loads, op applications) and stores; a value whose expression text was already emitted in the
// same body is reused (common subexpressions), so one node used twice is computed once.
//
// A `language` says how a target spells loads, splats, op calls and stores. The C++/xsimd
// language is defined here; the CUDA renderer brings its own, and the code generator above the
// emitter is shared. Generated names are local (t0, t1, ...), so identical kernels render to
// identical text.
// Depends on: the standard library only.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace fusebox::jit {

struct language {
  std::string value_type;  ///< the type of a body value ("W_": a template parameter, vector or scalar)
  std::string (*splat)(const std::string& value_type, const std::string& scalar);
  std::string (*load)(const std::string& value_type, const std::string& ptr);  ///< at column j, unit stride
  std::string (*load_strided)(const std::string& value_type, const std::string& ptr, const std::string& stride);
  std::string (*apply)(const std::string& op, const std::vector<std::string>& args);
  std::string (*store)(const std::string& ptr, const std::string& value);  ///< at column j
};

/// C++ over xsimd: bodies are generic lambdas instantiated for xsimd::batch<T> and for T.
inline const language& cpp_xsimd() {
  static const language l{
      "W_",
      [](const std::string& vt, const std::string& s) { return vt + "(" + s + ")"; },
      [](const std::string& vt, const std::string& p) { return "fusebox::cpu::load_v<" + vt + ">(" + p + " + j)"; },
      [](const std::string& vt, const std::string& p, const std::string& st) {
        return "fusebox::cpu::load_strided_v<" + vt + ">(" + p + " + static_cast<std::ptrdiff_t>(j) * " + st + ", " +
               st + ")";
      },
      [](const std::string& op, const std::vector<std::string>& args) {
        std::string s = "fusebox::ops::" + op + "::apply(";
        for (std::size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
        return s + ")";
      },
      [](const std::string& p, const std::string& v) { return "fusebox::cpu::store_v(" + p + " + j, " + v + ");"; },
  };
  return l;
}

/// One straight-line body.
class body {
 public:
  explicit body(const language& lang) : lang_(lang) {}
  const language& lang() const noexcept { return lang_; }

  /// Names the value of `expr`, emitting it once per body.
  std::string let(const std::string& expr) {
    if (auto it = names_.find(expr); it != names_.end()) return it->second;
    std::string name = "t" + std::to_string(next_++);
    lines_.push_back("const " + lang_.value_type + " " + name + " = " + expr + ";");
    names_.emplace(expr, name);
    return name;
  }
  void statement(const std::string& s) { lines_.push_back(s); }

  std::string text(const std::string& indent) const {
    std::string s;
    for (const auto& l : lines_) s += indent + l + "\n";
    return s;
  }

 private:
  const language& lang_;
  std::map<std::string, std::string> names_;
  std::vector<std::string> lines_;
  int next_ = 0;
};

}  // namespace fusebox::jit
