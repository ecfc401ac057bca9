// fusebox/backend/cuda/cublaslt.hpp: cuBLASLt, loaded at run time, and `lt_matmul`, the row-major GEMM
// with a fused bias and activation that the CUDA backend uses for matmul nodes.
//
// lt_matmul computes, for each of `batch` matrices, row-major
//     C[M,N] = epilogue(A[M,K] · B[K,N] + bias[N])      (bias broadcast over the rows)
// with float32, float16 or bfloat16 storage (A, B, C and bias all of that type) and float32
// accumulation and scaling in every case.
//
// Cases and choices:
// - Row-major through column-major: cuBLASLt is column-major at heart, and a row-major X[R,C] is
//   the column-major X^T[C,R] with the same leading dimension. So we ask for C^T = B^T · A^T with
//   no transposes: cuBLASLt's "A" is our B (N x K, ld N), its "B" is our A (K x M, ld K), its D is
//   C^T (N x M, ld N). This beats CUBLASLT_ORDER_ROW layouts because every kernel supports the
//   column order, and cuBLASLt's bias, which runs along the rows of D, is then indexed by n: the
//   broadcast over the rows of C that a linear layer wants.
// - float32 uses CUBLAS_COMPUTE_32F, which never rounds inputs to TF32 (that is
//   CUBLAS_COMPUTE_32F_FAST_TF32, not used): results match a float reference to float accuracy.
// - Epilogues: none, relu, gelu_tanh. CUBLASLT_EPILOGUE_GELU is the tanh approximation,
//   0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), not the erf form: cublasLt.h and the cuBLAS docs
//   only say "GELU"; PyTorch, whose addmm+GELU uses this epilogue, applies gelu(approximate='tanh')
//   on its non-Lt fallback for the same operation; and tests/cuda/runtime.cpp measures it (H100,
//   cuBLASLt 13.0, pre-activations in [-5, 5]: max |C - gelu_tanh| = 5.4e-6, max |C - gelu_erf|
//   = 4.7e-4). So it is offered only as `gelu_tanh`; an erf GELU must be a separate kernel.
// - Transposes: `trans_a` / `trans_b` say an operand is stored as the row-major transpose of its
//   matrix (a transposed view); cuBLASLt reads it with its own transpose flag, no copy.
// - Batches: `batch` matrices with element strides (packed by default; a stride of 0 for A or B
//   reuses one matrix for the whole batch); the bias is the same for every matrix.
// - Algorithms: `lt_algorithms(problem, k)` returns up to k candidates from cuBLASLt's heuristic,
//   best first, so a caller (max_autotune) can time them; `lt_matmul` takes an index into that
//   list or an algorithm itself, and otherwise runs the first.
// - Residual: with `residual`, C = A·B + R (+ bias, then the activation) for a matrix R laid out
//   as C (cuBLASLt's beta·C with beta = 1 and its C input apart from its D output): a residual
//   connection added as the product is written, no separate pass.
// - Alignment: the heuristic assumes every pointer is aligned to `problem.alignment` bytes (256,
//   as cuMemAlloc gives, by default); lt_matmul refuses pointers that are not, instead of letting
//   a kernel that relies on it read out of bounds.
//
// State: one cuBLASLt handle per process, and a 32 MiB workspace per stream that has run a
// matmul (matmuls on one stream are ordered, so they can share it; two streams cannot). Both are
// created on first use; before capturing a stream into a CUDA graph call `lt_prepare(stream)`,
// as allocating during a capture is not allowed. A workspace lives until `lt_release(stream)`:
// call it before destroying a stream that ran matmuls, or each such stream keeps 32 MiB of device
// memory for the rest of the process. Calls are serialised by a mutex (they only queue work; the
// GEMM itself runs asynchronously).
//
// No CUDA header is included: the types and constants below mirror cublasLt.h, cublas_api.h and
// library_types.h (CUDA 13.0). Libraries tried: libcublasLt.so.13, .so.12, .so.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/library.hpp,
// fusebox/backend/cuda/driver.hpp, fusebox/backend/cuda/memory.hpp, fusebox/profile.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/library.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/profile.hpp"

struct cublasLtContext;  // cublasLt.h: typedef struct cublasLtContext* cublasLtHandle_t;

namespace fusebox::cuda {

// --- cublasLt.h / cublas_api.h / library_types.h mirrors -----------------------------------
using cublasStatus_t = int;
using cublasLtHandle_t = ::cublasLtContext*;
// cublasLt.h makes the descriptors pointers to anonymous structs; only the pointers cross the
// library boundary, so tags of our own stand in for them.
struct cublaslt_matmul_desc_opaque;
struct cublaslt_matrix_layout_opaque;
struct cublaslt_matmul_preference_opaque;
using cublasLtMatmulDesc_t = cublaslt_matmul_desc_opaque*;
using cublasLtMatrixLayout_t = cublaslt_matrix_layout_opaque*;
using cublasLtMatmulPreference_t = cublaslt_matmul_preference_opaque*;

/// cublasLt.h's cublasLtMatmulAlgo_t: an algorithm configuration, passed by value.
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};
/// cublasLt.h's cublasLtMatmulHeuristicResult_t.
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
static_assert(sizeof(cublasLtMatmulAlgo_t) == 64 && sizeof(cublasLtMatmulHeuristicResult_t) == 96,
              "fusebox: the cuBLASLt mirrors must match cublasLt.h's layout");

inline constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
inline constexpr int CUBLAS_COMPUTE_32F = 68;  // cublasComputeType_t; not _FAST_TF32 (77)
inline constexpr int CUDA_R_32F = 0;            // cudaDataType
inline constexpr int CUDA_R_16F = 2;
inline constexpr int CUDA_R_16BF = 14;
inline constexpr std::int32_t CUBLAS_OP_N = 0;  // cublasOperation_t
inline constexpr std::int32_t CUBLAS_OP_T = 1;
// cublasLtMatmulDescAttributes_t
inline constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3;       // int32_t
inline constexpr int CUBLASLT_MATMUL_DESC_TRANSB = 4;       // int32_t
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE = 7;     // uint32_t
inline constexpr int CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8;  // const void*
// cublasLtMatrixLayoutAttribute_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5;           // int32_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6;  // int64_t, elements
// cublasLtMatmulPreferenceAttributes_t
inline constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;  // uint64_t
inline constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5;  // uint32_t, also B, C, D: 6-8
// cublasLtEpilogue_t
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DEFAULT = 1;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_RELU = 2;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_BIAS = 4;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_GELU = 32;  // the tanh approximation, see above
// cublasLtMatmulAlgoConfigAttributes_t and cublasLtReductionScheme_t
inline constexpr int CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2;         // int32_t
inline constexpr int CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3;   // uint32_t
inline constexpr std::uint32_t CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2;

/// The cuBLASLt functions fusebox calls; each comment names the symbol bound.
struct cublaslt_api {
  cublasStatus_t (*create)(cublasLtHandle_t*);   // cublasLtCreate
  cublasStatus_t (*destroy)(cublasLtHandle_t);   // cublasLtDestroy
  std::size_t (*get_version)();                  // cublasLtGetVersion
  const char* (*get_status_name)(cublasStatus_t);    // cublasLtGetStatusName (optional)
  const char* (*get_status_string)(cublasStatus_t);  // cublasLtGetStatusString (optional)
  cublasStatus_t (*matmul_desc_create)(cublasLtMatmulDesc_t*, int compute_type,
                                       int scale_type);  // cublasLtMatmulDescCreate
  cublasStatus_t (*matmul_desc_set_attribute)(cublasLtMatmulDesc_t, int attribute,
                                              const void* value, std::size_t bytes);  // cublasLtMatmulDescSetAttribute
  cublasStatus_t (*matmul_desc_destroy)(cublasLtMatmulDesc_t);  // cublasLtMatmulDescDestroy
  cublasStatus_t (*matrix_layout_create)(cublasLtMatrixLayout_t*, int type, std::uint64_t rows,
                                         std::uint64_t cols, std::int64_t ld);  // cublasLtMatrixLayoutCreate
  cublasStatus_t (*matrix_layout_set_attribute)(cublasLtMatrixLayout_t, int attribute,
                                                const void* value, std::size_t bytes);  // cublasLtMatrixLayoutSetAttribute
  cublasStatus_t (*matrix_layout_destroy)(cublasLtMatrixLayout_t);  // cublasLtMatrixLayoutDestroy
  cublasStatus_t (*matmul_preference_create)(cublasLtMatmulPreference_t*);  // cublasLtMatmulPreferenceCreate
  cublasStatus_t (*matmul_preference_set_attribute)(cublasLtMatmulPreference_t, int attribute,
                                                    const void* value, std::size_t bytes);  // cublasLtMatmulPreferenceSetAttribute
  cublasStatus_t (*matmul_preference_destroy)(cublasLtMatmulPreference_t);  // cublasLtMatmulPreferenceDestroy
  cublasStatus_t (*matmul_algo_get_heuristic)(
      cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
      cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t,
      int requested, cublasLtMatmulHeuristicResult_t* results, int* returned);  // cublasLtMatmulAlgoGetHeuristic
  cublasStatus_t (*matmul_algo_check)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t a,
                                      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                      const cublasLtMatmulAlgo_t*,
                                      cublasLtMatmulHeuristicResult_t*);  // cublasLtMatmulAlgoCheck
  cublasStatus_t (*matmul_algo_config_set_attribute)(cublasLtMatmulAlgo_t*, int attribute, const void* value,
                                                     std::size_t bytes);  // cublasLtMatmulAlgoConfigSetAttribute
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void* alpha,
                           const void* a, cublasLtMatrixLayout_t, const void* b,
                           cublasLtMatrixLayout_t, const void* beta, const void* c,
                           cublasLtMatrixLayout_t, void* d, cublasLtMatrixLayout_t,
                           const cublasLtMatmulAlgo_t*, void* workspace,
                           std::size_t workspace_bytes, CUstream);  // cublasLtMatmul

  std::size_t version = 0;  // cublasLtGetVersion: 130000 + 100·minor + patch for 13.x
  std::string path;         // the libcublasLt that was loaded
};

/// A cuBLASLt call that failed.
struct cublas_error : fusebox::error {
  cublas_error(const std::string& what, cublasStatus_t code) : fusebox::error(what), status(code) {}
  cublasStatus_t status;
};

namespace detail {

inline constexpr std::string_view libcublaslt_what = "libcublasLt (cuBLASLt)";

struct cublaslt_state {
  jit::shared_library library;
  cublaslt_api api{};
  std::exception_ptr failure;
};

FUSEBOX_RUNTIME_API void load_cublaslt(cublaslt_state& state);

FUSEBOX_RUNTIME_API const cublaslt_state& cublaslt_once();

}  // namespace detail

/// The loaded cuBLASLt; throws backend_unavailable if it cannot be loaded.
FUSEBOX_RUNTIME_API const cublaslt_api& cublaslt();

/// Throws cublas_error unless `status` is CUBLAS_STATUS_SUCCESS, naming the call, the status
/// and `context`.
FUSEBOX_RUNTIME_API void check_cublas(cublasStatus_t status, std::string_view call, std::string_view context = {});

// --- lt_matmul ---------------------------------------------------------------------------------

enum class lt_type { f32, f16, bf16 };
enum class lt_epilogue { none, relu, gelu_tanh };

constexpr const char* name(lt_type t) {
  switch (t) {
    case lt_type::f32: return "float32";
    case lt_type::f16: return "float16";
    case lt_type::bf16: return "bfloat16";
  }
  return "?";
}
constexpr const char* name(lt_epilogue e) {
  switch (e) {
    case lt_epilogue::none: return "none";
    case lt_epilogue::relu: return "relu";
    case lt_epilogue::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}
constexpr std::size_t size_of(lt_type t) { return t == lt_type::f32 ? 4 : 2; }

/// One GEMM, as lt_matmul computes it (see the header comment).
struct lt_problem {
  static constexpr std::int64_t packed = -1;  // a stride meaning "the next matrix follows"

  std::size_t m = 0, n = 0, k = 0;
  lt_type type = lt_type::f32;
  bool bias = false;
  lt_epilogue epilogue = lt_epilogue::none;
  std::size_t batch = 1;
  std::int64_t stride_a = packed;  // elements between the A matrices of a batch (packed: m*k)
  std::int64_t stride_b = packed;  // (packed: k*n; 0: one B for all)
  std::int64_t stride_c = packed;  // (packed: m*n; must not make C matrices overlap)
  std::uint32_t alignment = 256;   // bytes every pointer given to lt_matmul is aligned to
  bool trans_a = false;  // A is stored as row-major [K, M] (a transposed view): read as its transpose
  bool trans_b = false;  // B is stored as row-major [N, K]
  bool residual = false;  // C = A·B + R: R is read (laid out as C) and added before the epilogue
};

/// A candidate from cuBLASLt's heuristic.
struct lt_algorithm {
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace_bytes = 0;
  float waves = 0;  // the heuristic's device-utilisation estimate (1.0: one full wave)
};

/// Workspace given to cuBLASLt per stream (split-K and stream-K algorithms need it).
inline constexpr std::size_t lt_workspace_bytes = std::size_t{32} << 20;

namespace detail {

FUSEBOX_RUNTIME_API std::string describe(const lt_problem& p);

FUSEBOX_RUNTIME_API void validate(const lt_problem& p);

inline std::int64_t stride_or_packed(std::int64_t stride, std::size_t rows, std::size_t cols) {
  return stride == lt_problem::packed ? static_cast<std::int64_t>(rows * cols) : stride;
}

inline int cuda_type(lt_type t) {
  return t == lt_type::f32 ? CUDA_R_32F : t == lt_type::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

FUSEBOX_RUNTIME_API std::uint32_t epilogue_code(const lt_problem& p);

/// The descriptors of one problem, destroyed together.
struct lt_descriptors {
  const cublaslt_api& api;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // cuBLASLt's A, B, D (= C)
  cublasLtMatmulPreference_t preference = nullptr;

  lt_descriptors(const cublaslt_api& lt, const lt_problem& p, const void* bias);
  lt_descriptors(const lt_descriptors&) = delete;
  lt_descriptors& operator=(const lt_descriptors&) = delete;
  ~lt_descriptors();

  template <class T>
  void set(int attribute, const T& value, const std::string& what) {
    check_cublas(api.matmul_desc_set_attribute(operation, attribute, &value, sizeof value),
                 "cublasLtMatmulDescSetAttribute", what);
  }

  /// Creates `out` (a member, so the destructor frees it even if a later step throws).
  void layout(cublasLtMatrixLayout_t& out, int type, std::uint64_t rows, std::uint64_t cols,
              std::int64_t ld, std::size_t batch, std::int64_t stride, const std::string& what);

  std::vector<lt_algorithm> heuristic(cublasLtHandle_t handle, int count, const lt_problem& p) const;

  /// Split-K forms of `base` (K cut into `splits` parts computed side by side, then summed in
  /// the workspace in float32, a fixed order), those cuBLASLt accepts for this problem with the
  /// workspace fusebox gives it. The heuristic seldom proposes them for float32 on Hopper, yet a
  /// product with few output tiles (M = 256 rows: 64 tiles of 128 x 128 for 132 SMs) leaves
  /// most of the GPU idle without them.
  std::vector<lt_algorithm> split_k(cublasLtHandle_t handle, const lt_algorithm& base) const;
};

/// A problem's descriptors and heuristic choice, kept for the next call of the same problem:
/// creating descriptors and asking the heuristic costs tens of microseconds, as much as a small
/// GEMM itself (the latency workloads call the same three problems over and over).
struct lt_plan {
  std::unique_ptr<lt_descriptors> descriptors;
  lt_algorithm algorithm;
};

struct lt_state {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  std::map<CUstream, device_buffer> workspaces;
  std::map<std::string, lt_plan> plans;  // by lt_plan_key
};

/// Every field of a problem that its descriptors and algorithm depend on.
FUSEBOX_RUNTIME_API std::string lt_plan_key(const lt_problem& p);

inline lt_state& lt_shared() {
  static lt_state* state = new lt_state;  // never destroyed, like the library it uses
  return *state;
}

/// The handle, created on first use. Call with the state's mutex held.
FUSEBOX_RUNTIME_API cublasLtHandle_t lt_handle(lt_state& state);

FUSEBOX_RUNTIME_API CUdeviceptr lt_workspace(lt_state& state, CUstream on);

/// A device address as a "const void*" for cuBLASLt (which takes device pointers that way).
inline void* as_pointer(CUdeviceptr address) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
}

}  // namespace detail

/// Up to `count` algorithms for `problem`, best first by cuBLASLt's heuristic; with `split_k`,
/// followed by the split-K forms of the first two that cuBLASLt accepts (max_autotune times them).
FUSEBOX_RUNTIME_API std::vector<lt_algorithm> lt_algorithms(const lt_problem& problem, int count = 8,
                                                            bool split_k = false);

/// The algorithm the default path runs for `problem` (the heuristic's first choice), if it has
/// been chosen in this process: what backend/cuda/autotune.hpp's lt_choices persists.
FUSEBOX_RUNTIME_API std::optional<lt_algorithm> lt_default_algorithm(const lt_problem& problem);

/// Makes `algorithm` the default path's choice for `problem` without asking the heuristic: a
/// choice made by an earlier process with the same cuBLASLt and GPU (cublasLtMatmulAlgo_t is a
/// plain 64-byte record, valid across processes for one library version). The first heuristic
/// query of a process costs ~75 ms (cuBLASLt loads its tables), most of a warm start.
FUSEBOX_RUNTIME_API void lt_seed_default_algorithm(const lt_problem& problem, const lt_algorithm& algorithm);

/// Creates the handle and `on`'s workspace now: call before capturing `on` into a CUDA graph.
FUSEBOX_RUNTIME_API void lt_prepare(CUstream on);

/// Waits for `on` and frees its workspace (a later matmul on it allocates a new one). Call it
/// before destroying a stream that ran matmuls; not while `on` is being captured.
FUSEBOX_RUNTIME_API void lt_release(CUstream on);

namespace detail {

FUSEBOX_RUNTIME_API void lt_run(const lt_problem& problem, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                                CUdeviceptr bias, CUstream on, const lt_algorithm* chosen,
                                std::optional<std::size_t> index, CUdeviceptr residual);

}  // namespace detail

/// Queues C = epilogue(A·B [+ R] + bias) on `on` (row-major; see the header comment). `bias` is
/// read only when problem.bias, `residual` (R) only when problem.residual. `algorithm` indexes
/// lt_algorithms(problem); the default is the first.
inline void lt_matmul(const lt_problem& problem, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                      CUdeviceptr bias, CUstream on, std::optional<std::size_t> algorithm = {},
                      CUdeviceptr residual = 0) {
  detail::lt_run(problem, a, b, c, bias, on, nullptr, algorithm, residual);
}

/// The same with an algorithm from lt_algorithms(problem), skipping the heuristic (autotuned
/// callers keep the winner).
inline void lt_matmul(const lt_problem& problem, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                      CUdeviceptr bias, CUstream on, const lt_algorithm& algorithm, CUdeviceptr residual = 0) {
  detail::lt_run(problem, a, b, c, bias, on, &algorithm, std::nullopt, residual);
}

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API void detail::load_cublaslt(cublaslt_state& state) {
  state.library = open_first(
      libcublaslt_what,
      toolkit_library_candidates({"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}),
      "install cuBLAS (e.g. the libcublas package of the CUDA toolkit) and set FUSEBOX_CUDA_HOME or "
      "CUDA_HOME to the toolkit root, or put its lib64 directory on LD_LIBRARY_PATH");
  auto& api = state.api;
  auto bind = [&](auto*& function, const char* symbol) {
    resolve(state.library, function, symbol, libcublaslt_what);
  };
  bind(api.create, "cublasLtCreate");
  bind(api.destroy, "cublasLtDestroy");
  bind(api.get_version, "cublasLtGetVersion");
  bind(api.matmul_desc_create, "cublasLtMatmulDescCreate");
  bind(api.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  bind(api.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  bind(api.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  bind(api.matrix_layout_set_attribute, "cublasLtMatrixLayoutSetAttribute");
  bind(api.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  bind(api.matmul_preference_create, "cublasLtMatmulPreferenceCreate");
  bind(api.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(api.matmul_preference_destroy, "cublasLtMatmulPreferenceDestroy");
  bind(api.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(api.matmul_algo_check, "cublasLtMatmulAlgoCheck");
  bind(api.matmul_algo_config_set_attribute, "cublasLtMatmulAlgoConfigSetAttribute");
  bind(api.matmul, "cublasLtMatmul");
  // Only for messages: a library without them still works.
  try {
    bind(api.get_status_name, "cublasLtGetStatusName");
    bind(api.get_status_string, "cublasLtGetStatusString");
  } catch (const backend_unavailable&) {
    api.get_status_name = nullptr;
    api.get_status_string = nullptr;
  }
  api.version = api.get_version();
  api.path = loaded_file(state.library, reinterpret_cast<const void*>(api.create));
}

FUSEBOX_RUNTIME_API const detail::cublaslt_state& detail::cublaslt_once() {
  static const cublaslt_state* state = [] {
    auto* s = new cublaslt_state;  // never destroyed: see cuda/library.hpp
    try {
      load_cublaslt(*s);
    } catch (...) {
      s->failure = std::current_exception();
    }
    return s;
  }();
  return *state;
}

FUSEBOX_RUNTIME_API const cublaslt_api& cublaslt() {
  const auto& state = detail::cublaslt_once();
  if (state.failure) std::rethrow_exception(state.failure);
  return state.api;
}

FUSEBOX_RUNTIME_API void check_cublas(cublasStatus_t status, std::string_view call, std::string_view context) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const auto& api = cublaslt();
  const char* name = api.get_status_name ? api.get_status_name(status) : nullptr;
  const char* text = api.get_status_string ? api.get_status_string(status) : nullptr;
  std::string what = "fusebox: " + std::string(call) + " failed with " +
                     (name ? std::string(name) : "cuBLAS status " + std::to_string(status));
  if (text) what += " (" + std::string(text) + ")";
  if (!context.empty()) what += ": " + std::string(context);
  FUSEBOX_THROW(cublas_error(what, status));
}

FUSEBOX_RUNTIME_API std::string detail::describe(const lt_problem& p) {
  std::string s = "lt_matmul(M=" + std::to_string(p.m) + ", N=" + std::to_string(p.n) +
                  ", K=" + std::to_string(p.k) + ", " + name(p.type);
  if (p.batch != 1) s += ", batch " + std::to_string(p.batch);
  if (p.bias) s += ", bias";
  if (p.residual) s += ", + residual";
  if (p.trans_a) s += ", A transposed";
  if (p.trans_b) s += ", B transposed";
  if (p.epilogue != lt_epilogue::none) s += std::string(", ") + name(p.epilogue);
  return s + ")";
}

FUSEBOX_RUNTIME_API void detail::validate(const lt_problem& p) {
  auto fail = [&](const std::string& why) {
    FUSEBOX_THROW(invalid_argument("fusebox: " + describe(p) + ": " + why));
  };
  if (p.m == 0 || p.n == 0 || p.k == 0) fail("M, N and K must be positive");
  if (p.batch == 0) fail("the batch count must be positive");
  constexpr std::size_t limit = std::size_t{1} << 31;  // cuBLASLt's int32 batch count, sane dims
  if (p.m >= limit || p.n >= limit || p.k >= limit || p.batch >= limit)
    fail("every extent must be below 2^31");
  const auto elements = [](std::size_t r, std::size_t c) { return static_cast<std::int64_t>(r * c); };
  if (p.stride_a < 0 && p.stride_a != lt_problem::packed) fail("stride_a is negative");
  if (p.stride_b < 0 && p.stride_b != lt_problem::packed) fail("stride_b is negative");
  if (p.batch > 1 && p.stride_c != lt_problem::packed && p.stride_c < elements(p.m, p.n))
    fail("stride_c " + std::to_string(p.stride_c) + " is below M*N = " +
         std::to_string(elements(p.m, p.n)) + ", so the C matrices of the batch would overlap");
  const std::uint32_t a = p.alignment;
  if (a < size_of(p.type) || (a & (a - 1)) != 0)
    fail("alignment " + std::to_string(a) + " must be a power of two of at least the element size");
}

FUSEBOX_RUNTIME_API std::uint32_t detail::epilogue_code(const lt_problem& p) {
  std::uint32_t code = p.epilogue == lt_epilogue::relu        ? CUBLASLT_EPILOGUE_RELU
                       : p.epilogue == lt_epilogue::gelu_tanh ? CUBLASLT_EPILOGUE_GELU
                                                              : 0;
  if (p.bias) code |= CUBLASLT_EPILOGUE_BIAS;
  return code ? code : CUBLASLT_EPILOGUE_DEFAULT;
}

FUSEBOX_RUNTIME_API detail::lt_descriptors::lt_descriptors(const cublaslt_api& lt, const lt_problem& p,
                                                           const void* bias)
    : api(lt) {
  const std::string what = describe(p);
  check_cublas(api.matmul_desc_create(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate", what);
  // cuBLASLt's A is our B and its B our A; a transposed operand of ours is stored as the
  // row-major transpose, i.e. column-major in the shape cuBLASLt then transposes.
  set(CUBLASLT_MATMUL_DESC_TRANSA, p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, what);
  set(CUBLASLT_MATMUL_DESC_TRANSB, p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, what);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_code(p), what);
  if (p.bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, what);

  const int type = cuda_type(p.type);
  const auto n = static_cast<std::uint64_t>(p.n), m = static_cast<std::uint64_t>(p.m),
             k = static_cast<std::uint64_t>(p.k);
  // Column-major views of the row-major operands (header comment): B^T, A^T, C^T.
  if (p.trans_b)  // B's memory: row-major [N, K] = column-major [K, N]
    layout(a, type, k, n, static_cast<std::int64_t>(k), p.batch, stride_or_packed(p.stride_b, p.k, p.n),
           what + " layout of B");
  else
    layout(a, type, n, k, static_cast<std::int64_t>(n), p.batch, stride_or_packed(p.stride_b, p.k, p.n),
           what + " layout of B");
  if (p.trans_a)  // A's memory: row-major [K, M] = column-major [M, K]
    layout(b, type, m, k, static_cast<std::int64_t>(m), p.batch, stride_or_packed(p.stride_a, p.m, p.k),
           what + " layout of A");
  else
    layout(b, type, k, m, static_cast<std::int64_t>(k), p.batch, stride_or_packed(p.stride_a, p.m, p.k),
           what + " layout of A");
  layout(d, type, n, m, static_cast<std::int64_t>(n), p.batch,
         stride_or_packed(p.stride_c, p.m, p.n), what + " layout of C");

  check_cublas(api.matmul_preference_create(&preference), "cublasLtMatmulPreferenceCreate", what);
  const std::uint64_t workspace = lt_workspace_bytes;
  check_cublas(api.matmul_preference_set_attribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace, sizeof workspace),
               "cublasLtMatmulPreferenceSetAttribute", what + " (max workspace)");
  for (int i = 0; i < 4; ++i)  // A, B, C, D
    check_cublas(api.matmul_preference_set_attribute(
                     preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i, &p.alignment,
                     sizeof p.alignment),
                 "cublasLtMatmulPreferenceSetAttribute", what + " (alignment)");
}

FUSEBOX_RUNTIME_API detail::lt_descriptors::~lt_descriptors() {
  if (preference) api.matmul_preference_destroy(preference);
  for (auto* layout : {a, b, d})
    if (layout) api.matrix_layout_destroy(layout);
  if (operation) api.matmul_desc_destroy(operation);
}

FUSEBOX_RUNTIME_API void detail::lt_descriptors::layout(cublasLtMatrixLayout_t& out, int type, std::uint64_t rows,
                                                        std::uint64_t cols, std::int64_t ld, std::size_t batch,
                                                        std::int64_t stride, const std::string& what) {
  check_cublas(api.matrix_layout_create(&out, type, rows, cols, ld), "cublasLtMatrixLayoutCreate",
               what);
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    check_cublas(api.matrix_layout_set_attribute(out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof count),
                 "cublasLtMatrixLayoutSetAttribute", what + " (batch count)");
    check_cublas(api.matrix_layout_set_attribute(out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &stride, sizeof stride),
                 "cublasLtMatrixLayoutSetAttribute", what + " (batch stride)");
  }
}

FUSEBOX_RUNTIME_API std::vector<lt_algorithm> detail::lt_descriptors::heuristic(cublasLtHandle_t handle, int count,
                                                                                const lt_problem& p) const {
  profile::scoped_span span("cuBLASLt heuristic", "compile");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int returned = 0;
  check_cublas(api.matmul_algo_get_heuristic(handle, operation, a, b, d, d, preference, count,
                                             results.data(), &returned),
               "cublasLtMatmulAlgoGetHeuristic", describe(p));
  std::vector<lt_algorithm> out;
  for (int i = 0; i < returned; ++i)
    if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      out.push_back({results[static_cast<std::size_t>(i)].algo,
                     results[static_cast<std::size_t>(i)].workspaceSize,
                     results[static_cast<std::size_t>(i)].wavesCount});
  if (out.empty())
    FUSEBOX_THROW(cublas_error("fusebox: cuBLASLt has no algorithm for " + describe(p) + " with " +
                                   std::to_string(p.alignment) + "-byte aligned pointers and a " +
                                   std::to_string(lt_workspace_bytes >> 20) + " MiB workspace",
                               15 /* CUBLAS_STATUS_NOT_SUPPORTED */));
  return out;
}

FUSEBOX_RUNTIME_API std::vector<lt_algorithm> detail::lt_descriptors::split_k(cublasLtHandle_t handle,
                                                                              const lt_algorithm& base) const {
  std::vector<lt_algorithm> out;
  for (std::int32_t splits : {2, 3, 4, 8}) {
    cublasLtMatmulAlgo_t algo = base.algo;
    const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (api.matmul_algo_config_set_attribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) != 0 ||
        api.matmul_algo_config_set_attribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) != 0)
      continue;
    cublasLtMatmulHeuristicResult_t r{};
    if (api.matmul_algo_check(handle, operation, a, b, d, d, &algo, &r) != 0) continue;
    if (r.workspaceSize > lt_workspace_bytes) continue;
    out.push_back({algo, r.workspaceSize, r.wavesCount});
  }
  return out;
}

FUSEBOX_RUNTIME_API std::string detail::lt_plan_key(const lt_problem& p) {
  std::string k;
  for (const auto v : {static_cast<std::int64_t>(p.m), static_cast<std::int64_t>(p.n), static_cast<std::int64_t>(p.k),
                       static_cast<std::int64_t>(p.type), static_cast<std::int64_t>(p.bias),
                       static_cast<std::int64_t>(p.epilogue), static_cast<std::int64_t>(p.batch), p.stride_a, p.stride_b,
                       p.stride_c, static_cast<std::int64_t>(p.alignment), static_cast<std::int64_t>(p.trans_a),
                       static_cast<std::int64_t>(p.trans_b), static_cast<std::int64_t>(p.residual)})
    k += std::to_string(v) + ",";
  return k;
}

FUSEBOX_RUNTIME_API cublasLtHandle_t detail::lt_handle(lt_state& state) {
  if (!state.handle) {
    current_device();  // cuBLASLt runs in the primary context, which must be current
    check_cublas(cublaslt().create(&state.handle), "cublasLtCreate");
  }
  return state.handle;
}

FUSEBOX_RUNTIME_API CUdeviceptr detail::lt_workspace(lt_state& state, CUstream on) {
  auto& buffer = state.workspaces[on];
  buffer.ensure(lt_workspace_bytes);
  return buffer.get();
}

FUSEBOX_RUNTIME_API std::vector<lt_algorithm> lt_algorithms(const lt_problem& problem, int count, bool split_k) {
  detail::validate(problem);
  if (count < 1) FUSEBOX_THROW(invalid_argument("fusebox: lt_algorithms: count must be positive"));
  const auto& api = cublaslt();
  auto& state = detail::lt_shared();
  std::lock_guard lock(state.mutex);
  // cuBLASLt reads the bias pointer's alignment when choosing; stand in an address with exactly
  // the alignment the problem promises.
  const void* bias = detail::as_pointer(problem.alignment);
  detail::lt_descriptors descriptors(api, problem, bias);
  std::vector<lt_algorithm> list = descriptors.heuristic(detail::lt_handle(state), count, problem);
  if (split_k) {
    const std::size_t base = std::min<std::size_t>(list.size(), 2);
    for (std::size_t i = 0; i < base; ++i)
      for (const lt_algorithm& v : descriptors.split_k(detail::lt_handle(state), list[i])) list.push_back(v);
  }
  return list;
}

FUSEBOX_RUNTIME_API std::optional<lt_algorithm> lt_default_algorithm(const lt_problem& problem) {
  auto& state = detail::lt_shared();
  std::lock_guard lock(state.mutex);
  auto it = state.plans.find(detail::lt_plan_key(problem));
  if (it == state.plans.end()) return std::nullopt;
  return it->second.algorithm;
}

FUSEBOX_RUNTIME_API void lt_seed_default_algorithm(const lt_problem& problem, const lt_algorithm& algorithm) {
  detail::validate(problem);
  const auto& api = cublaslt();
  auto& state = detail::lt_shared();
  std::lock_guard lock(state.mutex);
  if (state.plans.count(detail::lt_plan_key(problem))) return;
  detail::lt_plan plan;
  plan.descriptors = std::make_unique<detail::lt_descriptors>(api, problem, detail::as_pointer(problem.alignment));
  plan.algorithm = algorithm;
  state.plans.emplace(detail::lt_plan_key(problem), std::move(plan));
}

FUSEBOX_RUNTIME_API void lt_prepare(CUstream on) {
  cublaslt();
  auto& state = detail::lt_shared();
  std::lock_guard lock(state.mutex);
  detail::lt_handle(state);
  detail::lt_workspace(state, on);
}

FUSEBOX_RUNTIME_API void lt_release(CUstream on) {
  auto& state = detail::lt_shared();
  std::lock_guard lock(state.mutex);
  const auto it = state.workspaces.find(on);
  if (it == state.workspaces.end()) return;
  current_device();
  // Matmuls queued on `on` may still be using the workspace.
  check(driver().stream_synchronize(on), "cuStreamSynchronize", "before freeing a cuBLASLt workspace");
  state.workspaces.erase(it);
}

FUSEBOX_RUNTIME_API void detail::lt_run(const lt_problem& problem, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c,
                                        CUdeviceptr bias, CUstream on, const lt_algorithm* chosen,
                                        std::optional<std::size_t> index, CUdeviceptr residual) {
  validate(problem);
  struct operand {
    const char* which;
    CUdeviceptr address;
    bool used;
  };
  const operand pointers[] = {{"A", a, true},
                              {"B", b, true},
                              {"C", c, true},
                              {"bias", bias, problem.bias},
                              {"residual", residual, problem.residual}};
  for (const auto& [which, address, used] : pointers) {
    if (!used) continue;
    if (address == 0 || address % problem.alignment != 0)
      FUSEBOX_THROW(invalid_argument("fusebox: " + describe(problem) + ": " + which + " pointer " +
                                     std::to_string(address) + " is " +
                                     (address ? "not aligned to " + std::to_string(problem.alignment) + " bytes"
                                              : "null")));
  }
  const auto& api = cublaslt();
  auto& state = lt_shared();
  std::lock_guard lock(state.mutex);
  const cublasLtHandle_t handle = lt_handle(state);
  const CUdeviceptr workspace = lt_workspace(state, on);
  if (!chosen && !index) {
    // The default algorithm: descriptors and heuristic made once per problem, then reused (the
    // bias pointer is the only per-call attribute).
    auto it = state.plans.find(lt_plan_key(problem));
    if (it == state.plans.end()) {
      lt_plan plan;
      plan.descriptors = std::make_unique<lt_descriptors>(api, problem, as_pointer(bias));
      const auto candidates = plan.descriptors->heuristic(handle, 1, problem);
      if (candidates.empty())
        FUSEBOX_THROW(invalid_argument("fusebox: " + describe(problem) + ": cuBLASLt offers no algorithm"));
      plan.algorithm = candidates[0];
      it = state.plans.emplace(lt_plan_key(problem), std::move(plan)).first;
    }
    lt_descriptors& d = *it->second.descriptors;
    if (problem.bias) d.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, as_pointer(bias), describe(problem));
    const float alpha = 1.0f, beta = problem.residual ? 1.0f : 0.0f;
    const CUdeviceptr c_in = problem.residual ? residual : c;
    check_cublas(api.matmul(handle, d.operation, &alpha, as_pointer(b), d.a, as_pointer(a), d.b, &beta, as_pointer(c_in),
                            d.d, as_pointer(c), d.d, &it->second.algorithm.algo, as_pointer(workspace),
                            lt_workspace_bytes, on),
                 "cublasLtMatmul", describe(problem));
    return;
  }
  lt_descriptors descriptors(api, problem, as_pointer(bias));
  lt_algorithm algorithm;
  if (chosen) {
    algorithm = *chosen;
  } else {
    const std::size_t i = index.value_or(0);
    const auto candidates = descriptors.heuristic(handle, static_cast<int>(std::max<std::size_t>(i + 1, 8)), problem);
    if (i >= candidates.size())
      FUSEBOX_THROW(invalid_argument("fusebox: " + describe(problem) + ": algorithm index " +
                                     std::to_string(i) + " but cuBLASLt offers " +
                                     std::to_string(candidates.size())));
    algorithm = candidates[i];
  }
  if (algorithm.workspace_bytes > lt_workspace_bytes)
    FUSEBOX_THROW(invalid_argument("fusebox: " + describe(problem) + ": the algorithm needs " +
                                   std::to_string(algorithm.workspace_bytes) + " bytes of workspace, more than " +
                                   std::to_string(lt_workspace_bytes)));
  const float alpha = 1.0f, beta = problem.residual ? 1.0f : 0.0f;
  // cuBLASLt's A is our B and its B our A (header comment); cuBLASLt's C input is the residual
  // (beta 1) or unused (beta 0), its D output is our C.
  check_cublas(api.matmul(handle, descriptors.operation, &alpha, as_pointer(b), descriptors.a,
                          as_pointer(a), descriptors.b, &beta, as_pointer(problem.residual ? residual : c), descriptors.d,
                          as_pointer(c), descriptors.d, &algorithm.algo, as_pointer(workspace),
                          lt_workspace_bytes, on),
               "cublasLtMatmul", describe(problem));
}
#endif

}  // namespace fusebox::cuda
