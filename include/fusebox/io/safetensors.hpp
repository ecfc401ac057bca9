// io/safetensors.hpp: parameters to and from the safetensors format (Hugging Face's; what
// `safetensors.torch.save_file` writes), so weights move between fusebox and PyTorch.
//
// The format: 8 bytes, the header's length N as a little-endian uint64; N bytes of JSON, an
// object mapping each tensor's name to {"dtype": "F32", "shape": [..], "data_offsets": [begin,
// end]} (offsets into the byte buffer that follows the header) plus an optional "__metadata__"
// object of strings; then the buffer, tensors row-major, little-endian. The writer pads the header
// with spaces to a multiple of 8 bytes, as the reference implementation does.
//
//   io::save_safetensors("mlp.safetensors", model.parameters());
//   io::load_safetensors("mlp.safetensors", model.parameters());   // into the model's tensors
//   io::load_safetensors(io::parse_safetensors(bytes, "mlp.safetensors"), "mlp.safetensors", params);
//                                                  // from bytes the program read itself (edge builds)
//
// Reading checks everything before it copies anything: the length word against the file size
// (and a 100 MB cap on the header, the reference's), JSON syntax, each entry's dtype (F64, F32,
// F16, BF16 read; others named as unsupported), shape and offsets (inside the buffer, matching
// shape x dtype size, no overlaps or holes), and then, per parameter, that the file holds it with
// the parameter's shape; with `strict` (torch's load_state_dict default), names in the file that
// the model does not have are an error too. Every error is fusebox::invalid_argument naming the
// file, the tensor and the numbers.
// Depends on: io/json.hpp, nn/parameters.hpp, core/{errors,low_precision}.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/low_precision.hpp"
#include "fusebox/io/json.hpp"
#include "fusebox/nn/parameters.hpp"

namespace fusebox::io {

struct safetensors_entry {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;  // into the data buffer
};

struct safetensors_file {
  std::vector<safetensors_entry> entries;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::byte> data;  // the buffer after the header

  const safetensors_entry* find(const std::string& name) const {
    for (const auto& e : entries)
      if (e.name == name) return &e;
    return nullptr;
  }
};

namespace detail {

inline std::size_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

inline std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

template <class U>
U load_le(const std::byte* p) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(p[i]) << (8 * i));
  return v;
}
template <class U>
void store_le(std::byte* p, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

/// Element i of an entry's data as a double (the conversion every supported dtype allows exactly).
inline double element(const std::string& dtype, const std::byte* p, std::size_t i) {
  if (dtype == "F64") return std::bit_cast<double>(load_le<std::uint64_t>(p + 8 * i));
  if (dtype == "F32") return std::bit_cast<float>(load_le<std::uint32_t>(p + 4 * i));
  if (dtype == "BF16") {
    bfloat16 h;
    h.bits = load_le<std::uint16_t>(p + 2 * i);
    return static_cast<float>(h);
  }
  float16 h;
  h.bits = load_le<std::uint16_t>(p + 2 * i);
  return static_cast<float>(h);
}

}  // namespace detail

/// Parses and validates a safetensors file's bytes (see the header comment for the checks);
/// `file` names them in errors. For programs that read the file themselves (an edge build links
/// no std::filesystem) or hold it in memory.
inline safetensors_file parse_safetensors(std::span<const std::byte> bytes, const std::string& file) {
  const std::size_t size = bytes.size();
  if (size < 8)
    FUSEBOX_THROW(invalid_argument(file + ": " + std::to_string(size) + " bytes, too short for the 8-byte header length"));
  const auto n = detail::load_le<std::uint64_t>(bytes.data());
  if (n > 100'000'000)
    FUSEBOX_THROW(invalid_argument(file + ": the header length word says " + std::to_string(n) +
                                   " bytes, above the format's 100000000-byte cap (not a safetensors file?)"));
  if (n > size - 8)
    FUSEBOX_THROW(invalid_argument(file + ": the header length word says " + std::to_string(n) + " bytes, but only " +
                                   std::to_string(size - 8) + " follow it (truncated file?)"));
  const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  if (n == 0 || header[0] != '{')
    FUSEBOX_THROW(invalid_argument(file + ": the header does not start with '{' (not a safetensors file?)"));
  const json doc = parse_json(header, file + " header");
  if (doc.type != json::kind::object) FUSEBOX_THROW(invalid_argument(file + ": the header is not a JSON object"));

  safetensors_file out;
  const std::uint64_t data_size = size - 8 - n;
  for (const auto& [name, v] : doc.members) {
    const std::string what = file + ": tensor '" + name + "'";
    if (name == "__metadata__") {
      if (v.type != json::kind::object) FUSEBOX_THROW(invalid_argument(file + ": __metadata__ is not an object"));
      for (const auto& [k, s] : v.members) {
        if (s.type != json::kind::string)
          FUSEBOX_THROW(invalid_argument(file + ": __metadata__ value of '" + k + "' is not a string"));
        out.metadata.emplace_back(k, s.text);
      }
      continue;
    }
    if (v.type != json::kind::object) FUSEBOX_THROW(invalid_argument(what + ": its entry is not an object"));
    const json* dtype = v.find("dtype");
    const json* shape = v.find("shape");
    const json* offsets = v.find("data_offsets");
    if (!dtype || dtype->type != json::kind::string || !shape || shape->type != json::kind::array || !offsets ||
        offsets->type != json::kind::array || offsets->items.size() != 2)
      FUSEBOX_THROW(invalid_argument(what + ": the entry needs \"dtype\" (a string), \"shape\" (an array) and "
                                            "\"data_offsets\" ([begin, end])"));
    safetensors_entry e;
    e.name = name;
    e.dtype = dtype->text;
    const std::size_t item = detail::dtype_size(e.dtype);
    if (item == 0) FUSEBOX_THROW(invalid_argument(what + ": unknown dtype '" + e.dtype + "'"));
    std::uint64_t count = 1;
    for (const auto& d : shape->items) {
      std::uint64_t x;
      if (!d.as_index(x)) FUSEBOX_THROW(invalid_argument(what + ": a shape extent is not a non-negative integer"));
      e.shape.push_back(x);
      if (x != 0 && count > UINT64_MAX / x) FUSEBOX_THROW(invalid_argument(what + ": the shape's element count overflows"));
      count *= x;
    }
    if (!offsets->items[0].as_index(e.begin) || !offsets->items[1].as_index(e.end) || e.begin > e.end)
      FUSEBOX_THROW(invalid_argument(what + ": data_offsets must be two integers begin <= end"));
    if (e.end > data_size)
      FUSEBOX_THROW(invalid_argument(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                                     "] run past the " + std::to_string(data_size) + "-byte data buffer (truncated file?)"));
    if (count > UINT64_MAX / item || e.end - e.begin != count * item)
      FUSEBOX_THROW(invalid_argument(what + ": " + e.dtype + " " + detail::shape_text(e.shape) + " needs " +
                                     std::to_string(count * item) + " bytes, data_offsets give " +
                                     std::to_string(e.end - e.begin)));
    out.entries.push_back(std::move(e));
  }
  // The tensors tile the buffer: no overlaps, no holes (the reference reader's rule).
  std::vector<const safetensors_entry*> order;
  for (const auto& e : out.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  std::uint64_t at = 0;
  for (const auto* e : order) {
    if (e->begin != at)
      FUSEBOX_THROW(invalid_argument(file + ": tensor '" + e->name + "' starts at byte " + std::to_string(e->begin) +
                                     " of the data buffer, expected " + std::to_string(at) +
                                     (e->begin < at ? " (overlaps the previous tensor)" : " (a hole before it)")));
    at = e->end;
  }
  if (at != data_size)
    FUSEBOX_THROW(invalid_argument(file + ": the tensors cover " + std::to_string(at) + " of the " +
                                   std::to_string(data_size) + " data bytes"));
  out.data.resize(data_size);
  std::memcpy(out.data.data(), bytes.data() + 8 + n, data_size);
  return out;
}

/// Reads and parses a safetensors file.
inline safetensors_file read_safetensors(const std::filesystem::path& path) {
  const std::string file = "safetensors file '" + path.string() + "'";
  std::ifstream in(path, std::ios::binary);
  if (!in) FUSEBOX_THROW(invalid_argument(file + ": cannot be opened"));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(std::as_bytes(std::span<const char>(bytes)), file);
}

/// Writes the parameters (in list order) as F32 (float) or F64 (double), with `metadata`.
template <class T>
void save_safetensors(const std::filesystem::path& path, const nn::parameter_list<T>& params,
                      const std::vector<std::pair<std::string, std::string>>& metadata = {{"format", "pt"}}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "save_safetensors: float or double parameters");
  const char* dtype = sizeof(T) == 4 ? "F32" : "F64";
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (std::size_t i = 0; i < metadata.size(); ++i)
      header += (i ? "," : "") + json_quote(metadata[i].first) + ":" + json_quote(metadata[i].second);
    header += "}";
  }
  std::uint64_t offset = 0;
  for (const auto& p : params) {
    if (header.size() > 1) header += ",";
    header += json_quote(p.name) + ":{\"dtype\":\"" + dtype + "\",\"shape\":[";
    for (std::size_t d = 0; d < p.shape.rank; ++d) header += (d ? "," : "") + std::to_string(p.shape.extent[d]);
    const std::uint64_t bytes = p.size() * sizeof(T);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::vector<std::byte> out(8 + header.size() + offset);
  detail::store_le<std::uint64_t>(out.data(), header.size());
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::byte* at = out.data() + 8 + header.size();
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  for (const auto& p : params)
    for (std::size_t i = 0; i < p.size(); ++i, at += sizeof(T)) detail::store_le<U>(at, std::bit_cast<U>(p.data[i]));

  // Written next to the target and renamed: a crash never leaves a half-written file under the name.
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) FUSEBOX_THROW(invalid_argument("save_safetensors: cannot write '" + tmp.string() + "'"));
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!f) FUSEBOX_THROW(invalid_argument("save_safetensors: writing '" + tmp.string() + "' failed"));
  }
  std::filesystem::rename(tmp, path);
}

/// The same from a file already read (`file` names it in errors): for callers that read its
/// metadata first.
template <class T>
void load_safetensors(const safetensors_file& f, const std::string& file, const nn::parameter_list<T>& params,
                      bool strict = true, std::source_location loc = std::source_location::current()) {
  std::vector<const safetensors_entry*> found;
  std::string missing;
  for (const auto& p : params) {
    const safetensors_entry* e = f.find(p.name);
    if (!e) {
      missing += (missing.empty() ? "'" : ", '") + p.name + "'";
      continue;
    }
    std::vector<std::uint64_t> want(p.shape.extent.begin(), p.shape.extent.begin() + p.shape.rank);
    if (e->shape != want)
      FUSEBOX_THROW(invalid_argument(file + ": tensor '" + p.name + "' is " + e->dtype + " " + detail::shape_text(e->shape) +
                                     " in the file but " + to_string(p.shape) + " in the model (at " + where(loc) + ")"));
    if (e->dtype != "F64" && e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16")
      FUSEBOX_THROW(invalid_argument(file + ": tensor '" + p.name + "' has dtype " + e->dtype +
                                     "; floating-point parameters load from F64, F32, F16 or BF16 (at " + where(loc) + ")"));
    found.push_back(e);
  }
  if (!missing.empty())
    FUSEBOX_THROW(invalid_argument(file + ": missing " + missing + " (the file holds " + std::to_string(f.entries.size()) +
                                   " tensors) (at " + where(loc) + ")"));
  if (strict) {
    std::string unexpected;
    for (const auto& e : f.entries)
      if (!params.find(e.name)) unexpected += (unexpected.empty() ? "'" : ", '") + e.name + "'";
    if (!unexpected.empty())
      FUSEBOX_THROW(invalid_argument(file + ": unexpected " + unexpected +
                                     " not among the model's parameters (pass strict = false to ignore them) (at " +
                                     where(loc) + ")"));
  }
  for (std::size_t k = 0; k < found.size(); ++k) {
    const auto& p = params[k];
    const std::byte* src = f.data.data() + found[k]->begin;
    for (std::size_t i = 0; i < p.size(); ++i) p.data[i] = static_cast<T>(detail::element(found[k]->dtype, src, i));
  }
}

/// Reads `path` into the parameters' tensors (converting F64/F32/F16/BF16 to T). Nothing is written
/// unless every parameter is found with its shape (and, with strict, the file holds nothing else).
template <class T>
void load_safetensors(const std::filesystem::path& path, const nn::parameter_list<T>& params, bool strict = true,
                      std::source_location loc = std::source_location::current()) {
  load_safetensors(read_safetensors(path), "load_safetensors: '" + path.string() + "'", params, strict, loc);
}

}  // namespace fusebox::io
