// fusebox/backend/cuda/cudnn.hpp: cuDNN 9's graph ("backend") API, loaded at run time, and the small
// helpers that build operation graphs with it. Used by backend/cuda/cudnn_attention.hpp.
//
// Only the backend API is bound: descriptors are made, given attributes and finalised; an
// operation graph is handed to cuDNN's heuristic, which offers engine configurations; one becomes
// an execution plan (finalising it compiles the engine's kernel), which runs with a variant pack
// (the device pointers by tensor id). No cuDNN or CUDA header is included: the enum values below
// mirror cudnn_graph.h of cuDNN 9 (the backend enums are part of its stable ABI from 9.0 on).
//
// Libraries tried, after $FUSEBOX_CUDA_HOME and $CUDA_HOME: libcudnn.so.9 by soname (Debian and
// NVIDIA's packages put it in the loader's path), then /usr/local/cuda/lib64. A missing library
// is a backend_unavailable; callers that have a kernel of their own for the same work (attention)
// fall back to it instead of failing.
//
// State: one handle per process, made on first use (it loads cuDNN's sub-libraries: ~0.1 s) and
// never destroyed (see backend/cuda/library.hpp); cudnnSetStream and the execution share a mutex.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/library.hpp,
// fusebox/backend/cuda/driver.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/library.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"

struct cudnnContext;  // cudnn_graph.h: typedef struct cudnnContext* cudnnHandle_t;

namespace fusebox::cuda {

// --- cudnn_graph.h mirrors (cuDNN 9) --------------------------------------------------------
using cudnnStatus_t = int;
using cudnnHandle_t = ::cudnnContext*;
using cudnnBackendDescriptor_t = void*;
inline constexpr cudnnStatus_t CUDNN_STATUS_SUCCESS = 0;

namespace cudnn_enum {
// cudnnBackendDescriptorType_t
inline constexpr int pointwise_descriptor = 0, engine_descriptor = 2, enginecfg_descriptor = 3,
                     engineheur_descriptor = 4, execution_plan_descriptor = 5, operation_pointwise_descriptor = 13,
                     operationgraph_descriptor = 15, variant_pack_descriptor = 16, tensor_descriptor = 17,
                     matmul_descriptor = 18, operation_matmul_descriptor = 19, reduction_descriptor = 21,
                     operation_reduction_descriptor = 22;
// cudnnBackendAttributeType_t
inline constexpr int type_handle = 0, type_data_type = 1, type_boolean = 2, type_int64 = 3, type_void_ptr = 6,
                     type_heur_mode = 8, type_pointwise_mode = 14, type_backend_descriptor = 15,
                     type_reduction_operator = 18;
// cudnnBackendAttributeName_t
inline constexpr int pointwise_mode = 0, pointwise_math_prec = 1, pointwise_axis = 9;
inline constexpr int engineheur_mode = 200, engineheur_operation_graph = 201, engineheur_results = 202;
inline constexpr int enginecfg_engine = 300;
inline constexpr int execution_plan_handle = 400, execution_plan_engine_config = 401,
                     execution_plan_workspace_size = 402;
inline constexpr int operation_pointwise_pw_descriptor = 750, operation_pointwise_xdesc = 751,
                     operation_pointwise_bdesc = 752, operation_pointwise_ydesc = 753, operation_pointwise_tdesc = 758;
inline constexpr int operationgraph_handle = 800, operationgraph_ops = 801;
inline constexpr int tensor_byte_alignment = 900, tensor_data_type = 901, tensor_dimensions = 902,
                     tensor_strides = 903, tensor_unique_id = 906, tensor_is_virtual = 907, tensor_is_by_value = 908;
inline constexpr int variant_pack_unique_ids = 1000, variant_pack_data_pointers = 1001, variant_pack_workspace = 1003;
inline constexpr int engine_global_index = 1301;
inline constexpr int matmul_comp_type = 1500;
inline constexpr int operation_matmul_adesc = 1520, operation_matmul_bdesc = 1521, operation_matmul_cdesc = 1522,
                     operation_matmul_desc = 1523;
inline constexpr int reduction_operator = 1600, reduction_comp_type = 1601;
inline constexpr int operation_reduction_xdesc = 1610, operation_reduction_ydesc = 1611,
                     operation_reduction_desc = 1612;
// cudnnDataType_t
inline constexpr int data_float = 0, data_half = 2, data_bfloat16 = 9, data_boolean = 11;
// cudnnPointwiseMode_t
inline constexpr int pw_add = 0, pw_mul = 1, pw_div = 6, pw_sub = 9, pw_exp = 13, pw_log = 15, pw_cmp_ge = 303,
                     pw_gen_index = 501, pw_binary_select = 601;
// cudnnReduceTensorOp_t
inline constexpr int reduce_add = 0, reduce_max = 3;
// cudnnBackendHeurMode_t
inline constexpr int heur_mode_a = 3;
}  // namespace cudnn_enum

/// The cuDNN functions fusebox calls; each comment names the symbol bound.
struct cudnn_api {
  std::size_t (*get_version)();                                   // cudnnGetVersion
  const char* (*get_error_string)(cudnnStatus_t);                 // cudnnGetErrorString
  void (*get_last_error_string)(char*, std::size_t);              // cudnnGetLastErrorString
  cudnnStatus_t (*create)(cudnnHandle_t*);                        // cudnnCreate
  cudnnStatus_t (*set_stream)(cudnnHandle_t, CUstream);           // cudnnSetStream
  cudnnStatus_t (*create_descriptor)(int, cudnnBackendDescriptor_t*);  // cudnnBackendCreateDescriptor
  cudnnStatus_t (*destroy_descriptor)(cudnnBackendDescriptor_t);       // cudnnBackendDestroyDescriptor
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);                 // cudnnBackendFinalize
  cudnnStatus_t (*set_attribute)(cudnnBackendDescriptor_t, int name, int type, std::int64_t count,
                                 const void* values);  // cudnnBackendSetAttribute
  cudnnStatus_t (*get_attribute)(cudnnBackendDescriptor_t, int name, int type, std::int64_t requested,
                                 std::int64_t* count, void* values);  // cudnnBackendGetAttribute
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t plan,
                           cudnnBackendDescriptor_t variant_pack);  // cudnnBackendExecute

  std::size_t version = 0;  // cudnnGetVersion: 10000·major + 100·minor + patch (91400 for 9.14.0)
  std::string path;         // the libcudnn that was loaded
};

/// A cuDNN call that failed, with cuDNN's own account of why (cudnnGetLastErrorString).
struct cudnn_error : fusebox::error {
  cudnn_error(const std::string& what, cudnnStatus_t code) : fusebox::error(what), status(code) {}
  cudnnStatus_t status;
};

namespace detail {

inline constexpr std::string_view libcudnn_what = "libcudnn (cuDNN 9)";

struct cudnn_state {
  jit::shared_library library;
  cudnn_api api{};
  std::exception_ptr failure;
};

FUSEBOX_RUNTIME_API void load_cudnn(cudnn_state& state);

FUSEBOX_RUNTIME_API const cudnn_state& cudnn_once();

}  // namespace detail

/// The loaded cuDNN; throws backend_unavailable if it cannot be loaded.
FUSEBOX_RUNTIME_API const cudnn_api& cudnn();

/// Throws cudnn_error for a failed call, with the call's name and cuDNN's last error message.
FUSEBOX_RUNTIME_API void cudnn_check(cudnnStatus_t status, std::string_view call);

/// The process's cuDNN handle on the current device, and the mutex that serialises its use
/// (cudnnSetStream then cudnnBackendExecute must not interleave between threads).
struct cudnn_context {
  cudnnHandle_t handle = nullptr;
  std::mutex mutex;
};
FUSEBOX_RUNTIME_API cudnn_context& cudnn_handle();

/// An owned backend descriptor.
class cudnn_descriptor {
 public:
  cudnn_descriptor() = default;
  explicit cudnn_descriptor(int type) { cudnn_check(cudnn().create_descriptor(type, &d_), "cudnnBackendCreateDescriptor"); }
  cudnn_descriptor(cudnn_descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  cudnn_descriptor& operator=(cudnn_descriptor&& o) noexcept;
  cudnn_descriptor(const cudnn_descriptor&) = delete;
  cudnn_descriptor& operator=(const cudnn_descriptor&) = delete;
  ~cudnn_descriptor() { reset(); }

  cudnnBackendDescriptor_t get() const noexcept { return d_; }
  explicit operator bool() const noexcept { return d_ != nullptr; }

  /// cudnnBackendSetAttribute with `count` values of attribute type `type`.
  cudnn_descriptor& set(int name, int type, std::int64_t count, const void* values) {
    cudnn_check(cudnn().set_attribute(d_, name, type, count, values), "cudnnBackendSetAttribute");
    return *this;
  }
  cudnn_descriptor& set(int name, std::int64_t value) { return set(name, cudnn_enum::type_int64, 1, &value); }
  cudnn_descriptor& set(int name, const cudnn_descriptor& d) {
    const cudnnBackendDescriptor_t p = d.get();
    return set(name, cudnn_enum::type_backend_descriptor, 1, &p);
  }
  cudnn_descriptor& set_data_type(int name, int data_type) { return set(name, cudnn_enum::type_data_type, 1, &data_type); }
  cudnn_descriptor& finalize(std::string_view what = "cudnnBackendFinalize") {
    cudnn_check(cudnn().finalize(d_), what);
    return *this;
  }

 private:
  void reset() noexcept {
    if (d_) cudnn().destroy_descriptor(d_);
    d_ = nullptr;
  }
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API void detail::load_cudnn(cudnn_state& state) {
  state.library = open_first(libcudnn_what, toolkit_library_candidates({"libcudnn.so.9"}),
                             "install cuDNN 9 (NVIDIA's cudnn9-cuda-13 package, or the toolkit's) or put its "
                             "directory on LD_LIBRARY_PATH");
  auto& api = state.api;
  auto bind = [&](auto*& function, const char* symbol) { resolve(state.library, function, symbol, libcudnn_what); };
  bind(api.get_version, "cudnnGetVersion");
  bind(api.get_error_string, "cudnnGetErrorString");
  bind(api.get_last_error_string, "cudnnGetLastErrorString");
  bind(api.create, "cudnnCreate");
  bind(api.set_stream, "cudnnSetStream");
  bind(api.create_descriptor, "cudnnBackendCreateDescriptor");
  bind(api.destroy_descriptor, "cudnnBackendDestroyDescriptor");
  bind(api.finalize, "cudnnBackendFinalize");
  bind(api.set_attribute, "cudnnBackendSetAttribute");
  bind(api.get_attribute, "cudnnBackendGetAttribute");
  bind(api.execute, "cudnnBackendExecute");
  api.version = api.get_version();
  if (api.version < 90000)
    FUSEBOX_THROW(backend_unavailable("cuDNN", "the libcudnn at '" + loaded_file(state.library, reinterpret_cast<const void*>(api.create)) +
                                                   "' is version " + std::to_string(api.version) + ", older than 9.0",
                                      "install cuDNN 9"));
  api.path = loaded_file(state.library, reinterpret_cast<const void*>(api.create));
}

FUSEBOX_RUNTIME_API const detail::cudnn_state& detail::cudnn_once() {
  static const cudnn_state* state = [] {
    auto* s = new cudnn_state;  // never destroyed: see cuda/library.hpp
    try {
      load_cudnn(*s);
    } catch (...) {
      s->failure = std::current_exception();
    }
    return s;
  }();
  return *state;
}

FUSEBOX_RUNTIME_API const cudnn_api& cudnn() {
  const auto& state = detail::cudnn_once();
  if (state.failure) std::rethrow_exception(state.failure);
  return state.api;
}

FUSEBOX_RUNTIME_API void cudnn_check(cudnnStatus_t status, std::string_view call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const cudnn_api& api = cudnn();
  char message[1024] = {};
  api.get_last_error_string(message, sizeof message);
  FUSEBOX_THROW(cudnn_error("fusebox: " + std::string(call) + " failed: " + api.get_error_string(status) +
                                (message[0] ? std::string(" (") + message + ")" : std::string()),
                            status));
}

FUSEBOX_RUNTIME_API cudnn_context& cudnn_handle() {
  static cudnn_context* context = [] {
    current_device();  // the primary context, current on this thread: cuDNN's runtime uses it too
    auto* c = new cudnn_context;  // never destroyed, like cuBLASLt's handle
    cudnn_check(cudnn().create(&c->handle), "cudnnCreate");
    return c;
  }();
  return *context;
}

FUSEBOX_RUNTIME_API cudnn_descriptor& cudnn_descriptor::operator=(cudnn_descriptor&& o) noexcept {
  if (this != &o) {
    reset();
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}
#endif

}  // namespace fusebox::cuda
