// fusebox/backend/cuda/driver.hpp: the CUDA driver API (libcuda), loaded at run time; the device the
// process uses and its primary context.
//
// `driver()` is the process-wide table of driver functions, loaded on first use (thread-safe),
// with cuInit(0) called once. If libcuda is missing, lacks a function, or cuInit fails (no
// device, a stub library, an old driver), the failure is kept and every later `driver()` throws
// the same `fusebox::backend_unavailable`; `available()` asks the same question without
// throwing. `check(result, "cuMemAlloc", context)` turns a CUresult into a `driver_error` naming
// the call, CUDA's name and text for the error, and the caller's context (sizes, kernel names).
//
// `current_device()` picks device 0 (or $FUSEBOX_CUDA_DEVICE), retains its primary context once
// per process and makes it current on the calling thread. The primary context is the one the CUDA
// runtime uses too, so cuBLASLt (which runs on cudart) and our kernels share memory and streams.
// It is never released: releasing it while static objects still own device memory would make
// their destructors fail.
//
// No CUDA header is included (DESIGN.md: one binary runs everywhere). The types and constants
// below mirror cuda.h (CUDA 13.0); the opaque handles are declared with cuda.h's own struct tags,
// so they are the very same types when a translation unit also includes cuda.h. The table's
// members are snake_case rather than cuda.h's names because cuda.h turns many of those names into
// macros (cuMemAlloc -> cuMemAlloc_v2, and _ptsz variants under per-thread default streams).
// Where the driver exports versioned symbols, the table binds the versioned one explicitly.
//
// Depends on: the C++20 standard library, fusebox/core/{errors,linkage}.hpp, fusebox/backend/cuda/library.hpp,
// fusebox/pipeline/targets.hpp.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "fusebox/backend/cuda/library.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/pipeline/targets.hpp"

// cuda.h: the opaque handle types, at global scope as there (see above).
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;

namespace fusebox::cuda {

// --- cuda.h types -----------------------------------------------------------------------------
using CUresult = int;                      // enum cudaError_enum
using CUdevice = int;                      // CUdevice_v1
using CUdeviceptr = unsigned long long;    // CUdeviceptr_v2 (64-bit hosts only)
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;
using CUgraph = ::CUgraph_st*;
using CUgraphExec = ::CUgraphExec_st*;
using CUgraphNode = ::CUgraphNode_st*;

/// CUgraphExecUpdateResultInfo_v1: why cuGraphExecUpdate refused an update (`result` is a
/// CUgraphExecUpdateResult: 0 success, 2 topology changed, 3 node type changed, ...).
struct CUgraphExecUpdateResultInfo {
  int result = 0;
  CUgraphNode error_node = nullptr;
  CUgraphNode error_from_node = nullptr;
};

// --- cuda.h constants (only those fusebox uses) -----------------------------------------------
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
// CUdevice_attribute
inline constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
// CUfunction_attribute
inline constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
// CUstream_flags, CUevent_flags
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DEFAULT = 0x0;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
// CUstreamCaptureMode
inline constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
inline constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
inline constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;

/// The driver functions fusebox calls; each comment names the exported symbol bound.
struct driver_api {
  CUresult (*init)(unsigned flags);                               // cuInit
  CUresult (*driver_get_version)(int* version);                   // cuDriverGetVersion
  CUresult (*get_error_name)(CUresult, const char** name);        // cuGetErrorName
  CUresult (*get_error_string)(CUresult, const char** text);      // cuGetErrorString

  CUresult (*device_get)(CUdevice*, int ordinal);                 // cuDeviceGet
  CUresult (*device_get_count)(int* count);                       // cuDeviceGetCount
  CUresult (*device_get_attribute)(int* value, int attribute, CUdevice);  // cuDeviceGetAttribute
  CUresult (*device_get_name)(char* name, int length, CUdevice);  // cuDeviceGetName
  CUresult (*device_primary_ctx_retain)(CUcontext*, CUdevice);    // cuDevicePrimaryCtxRetain
  CUresult (*ctx_get_current)(CUcontext*);                        // cuCtxGetCurrent
  CUresult (*ctx_set_current)(CUcontext);                         // cuCtxSetCurrent
  CUresult (*ctx_synchronize)();                                  // cuCtxSynchronize

  CUresult (*mem_alloc)(CUdeviceptr*, std::size_t bytes);         // cuMemAlloc_v2
  CUresult (*mem_free)(CUdeviceptr);                              // cuMemFree_v2
  CUresult (*mem_alloc_host)(void**, std::size_t bytes);          // cuMemAllocHost_v2
  CUresult (*mem_free_host)(void*);                               // cuMemFreeHost
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, std::size_t);  // cuMemcpyHtoD_v2
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, std::size_t);        // cuMemcpyDtoH_v2
  CUresult (*memcpy_dtod)(CUdeviceptr, CUdeviceptr, std::size_t);  // cuMemcpyDtoD_v2
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, std::size_t, CUstream);  // cuMemcpyHtoDAsync_v2
  CUresult (*memcpy_dtoh_async)(void*, CUdeviceptr, std::size_t, CUstream);  // cuMemcpyDtoHAsync_v2
  CUresult (*memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, std::size_t, CUstream);  // cuMemcpyDtoDAsync_v2
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, std::size_t);  // cuMemsetD8_v2
  CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, std::size_t, CUstream);  // cuMemsetD8Async

  CUresult (*stream_create)(CUstream*, unsigned flags);           // cuStreamCreate
  CUresult (*stream_destroy)(CUstream);                           // cuStreamDestroy_v2
  CUresult (*stream_synchronize)(CUstream);                       // cuStreamSynchronize
  CUresult (*stream_wait_event)(CUstream, CUevent, unsigned flags);  // cuStreamWaitEvent
  CUresult (*event_create)(CUevent*, unsigned flags);             // cuEventCreate
  CUresult (*event_record)(CUevent, CUstream);                    // cuEventRecord
  CUresult (*event_synchronize)(CUevent);                         // cuEventSynchronize
  CUresult (*event_query)(CUevent);                               // cuEventQuery
  CUresult (*event_elapsed_time)(float* ms, CUevent start, CUevent stop);  // cuEventElapsedTime_v2, else cuEventElapsedTime
  CUresult (*event_destroy)(CUevent);                             // cuEventDestroy_v2

  CUresult (*module_load_data)(CUmodule*, const void* image);     // cuModuleLoadData
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char* name);  // cuModuleGetFunction
  CUresult (*module_unload)(CUmodule);                            // cuModuleUnload
  CUresult (*launch_kernel)(CUfunction, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                            unsigned block_x, unsigned block_y, unsigned block_z,
                            unsigned shared_bytes, CUstream, void** params, void** extra);  // cuLaunchKernel
  CUresult (*func_set_attribute)(CUfunction, int attribute, int value);  // cuFuncSetAttribute

  CUresult (*stream_begin_capture)(CUstream, int mode);           // cuStreamBeginCapture_v2
  CUresult (*stream_end_capture)(CUstream, CUgraph*);             // cuStreamEndCapture
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long flags);  // cuGraphInstantiateWithFlags
  CUresult (*graph_launch)(CUgraphExec, CUstream);                // cuGraphLaunch
  CUresult (*graph_exec_destroy)(CUgraphExec);                    // cuGraphExecDestroy
  CUresult (*graph_destroy)(CUgraph);                             // cuGraphDestroy
  CUresult (*graph_exec_update)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*);  // cuGraphExecUpdate_v2

  int version = 0;   // cuDriverGetVersion: 13000 for CUDA 13.0
  std::string path;  // the libcuda that was loaded
};

/// A driver call that failed. `result` is the CUresult, for callers that handle one case.
struct driver_error : fusebox::error {
  driver_error(const std::string& what, CUresult code) : fusebox::error(what), result(code) {}
  CUresult result;
};

// cuda::require_device, set by driver_once below: pipeline/targets.hpp.

namespace detail {

inline constexpr std::string_view libcuda_what = "libcuda (the NVIDIA driver library)";

struct driver_state {
  jit::shared_library library;
  driver_api api{};
  std::exception_ptr failure;  // set once if loading or cuInit failed
};

/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", from the driver when it can say.
FUSEBOX_RUNTIME_API std::string describe(const driver_api& api, CUresult result);

FUSEBOX_RUNTIME_API void load_driver(driver_state& state);

inline void require_device_here();
FUSEBOX_RUNTIME_API const driver_state& driver_once();

}  // namespace detail

/// The loaded driver; throws backend_unavailable (the same failure each time) if CUDA cannot run.
FUSEBOX_RUNTIME_API const driver_api& driver();

/// Throws driver_error unless `result` is CUDA_SUCCESS: "fusebox: cuMemAlloc failed with
/// CUDA_ERROR_OUT_OF_MEMORY (out of memory): <context>".
FUSEBOX_RUNTIME_API void check(CUresult result, std::string_view call, std::string_view context = {});

/// What fusebox knows about the device it runs on.
struct device_info {
  int ordinal = 0;
  std::string name;      // "NVIDIA H100 80GB HBM3"
  int sm_major = 0;      // compute capability
  int sm_minor = 0;
  int sm_count = 0;      // streaming multiprocessors
  int max_shared_bytes_optin = 0;  // dynamic shared memory a block may opt in to
  std::string arch;      // NVRTC's -arch value: "sm_90"
  CUdevice device = 0;
  CUcontext context = nullptr;  // the primary context, retained for the life of the process
};

namespace detail {

/// The ordinal from $FUSEBOX_CUDA_DEVICE (default 0), checked against the device count.
FUSEBOX_RUNTIME_API int selected_ordinal(const driver_api& api);

FUSEBOX_RUNTIME_API device_info open_device();

struct device_state {
  device_info info;
  std::exception_ptr failure;
};

FUSEBOX_RUNTIME_API const device_state& device_once();

}  // namespace detail

/// The device fusebox uses, with its primary context made current on the calling thread (CUDA
/// contexts are per thread, so every thread that touches the device goes through here).
FUSEBOX_RUNTIME_API const device_info& current_device();

namespace detail {
inline void require_device_here() { (void)current_device(); }
}  // namespace detail

/// Whether the CUDA backend can run here: libcuda loads, cuInit succeeds and the selected device
/// exists. Never throws; creates no context. `driver()` says why when this is false.
FUSEBOX_RUNTIME_API bool available() noexcept;

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API std::string detail::describe(const driver_api& api, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name) api.get_error_name(result, &name);
  if (api.get_error_string) api.get_error_string(result, &text);
  // A stub or broken libcuda may not name its own errors; the codes fusebox tests for it can.
  if (!name && result == CUDA_ERROR_STUB_LIBRARY) name = "CUDA_ERROR_STUB_LIBRARY";
  if (!name && result == CUDA_ERROR_NO_DEVICE) name = "CUDA_ERROR_NO_DEVICE";
  std::string out = name ? name : "CUDA error " + std::to_string(result);
  if (text) out += std::string(" (") + text + ")";
  return out;
}

FUSEBOX_RUNTIME_API void detail::load_driver(driver_state& state) {
  state.library = open_first(
      libcuda_what, {"libcuda.so.1", "libcuda.so"},
      "install the NVIDIA driver (it provides libcuda.so.1) and run on a machine with an NVIDIA "
      "GPU, or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH; CPU work is unaffected");
  const auto& lib = state.library;
  auto& api = state.api;
  auto bind = [&](auto*& function, const char* symbol) {
    resolve(lib, function, symbol, libcuda_what);
  };
  bind(api.init, "cuInit");
  bind(api.driver_get_version, "cuDriverGetVersion");
  bind(api.get_error_name, "cuGetErrorName");
  bind(api.get_error_string, "cuGetErrorString");
  bind(api.device_get, "cuDeviceGet");
  bind(api.device_get_count, "cuDeviceGetCount");
  bind(api.device_get_attribute, "cuDeviceGetAttribute");
  bind(api.device_get_name, "cuDeviceGetName");
  bind(api.device_primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  bind(api.ctx_get_current, "cuCtxGetCurrent");
  bind(api.ctx_set_current, "cuCtxSetCurrent");
  bind(api.ctx_synchronize, "cuCtxSynchronize");
  bind(api.mem_alloc, "cuMemAlloc_v2");
  bind(api.mem_free, "cuMemFree_v2");
  bind(api.mem_alloc_host, "cuMemAllocHost_v2");
  bind(api.mem_free_host, "cuMemFreeHost");
  bind(api.memcpy_htod, "cuMemcpyHtoD_v2");
  bind(api.memcpy_dtoh, "cuMemcpyDtoH_v2");
  bind(api.memcpy_dtod, "cuMemcpyDtoD_v2");
  bind(api.memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  bind(api.memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  bind(api.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
  bind(api.memset_d8, "cuMemsetD8_v2");
  bind(api.memset_d8_async, "cuMemsetD8Async");
  bind(api.stream_create, "cuStreamCreate");
  bind(api.stream_destroy, "cuStreamDestroy_v2");
  bind(api.stream_synchronize, "cuStreamSynchronize");
  bind(api.stream_wait_event, "cuStreamWaitEvent");
  bind(api.event_create, "cuEventCreate");
  bind(api.event_record, "cuEventRecord");
  bind(api.event_synchronize, "cuEventSynchronize");
  bind(api.event_query, "cuEventQuery");
  // cuda.h 12.8+ maps cuEventElapsedTime to _v2; older drivers export only the first version,
  // with the same signature and meaning for events recorded on one device.
  try {
    bind(api.event_elapsed_time, "cuEventElapsedTime_v2");
  } catch (const backend_unavailable&) {
    bind(api.event_elapsed_time, "cuEventElapsedTime");
  }
  bind(api.event_destroy, "cuEventDestroy_v2");
  bind(api.module_load_data, "cuModuleLoadData");
  bind(api.module_get_function, "cuModuleGetFunction");
  bind(api.module_unload, "cuModuleUnload");
  bind(api.launch_kernel, "cuLaunchKernel");
  bind(api.func_set_attribute, "cuFuncSetAttribute");
  bind(api.stream_begin_capture, "cuStreamBeginCapture_v2");
  bind(api.stream_end_capture, "cuStreamEndCapture");
  bind(api.graph_instantiate, "cuGraphInstantiateWithFlags");
  bind(api.graph_launch, "cuGraphLaunch");
  bind(api.graph_exec_destroy, "cuGraphExecDestroy");
  bind(api.graph_destroy, "cuGraphDestroy");
  bind(api.graph_exec_update, "cuGraphExecUpdate_v2");
  api.path = loaded_file(lib, reinterpret_cast<const void*>(api.init));

  // cuDriverGetVersion works before cuInit; the version makes an init failure easier to read.
  if (api.driver_get_version(&api.version) != CUDA_SUCCESS) api.version = 0;
  const CUresult result = api.init(0);
  if (result == CUDA_SUCCESS) return;
  const std::string loaded =
      "loaded " + std::string(libcuda_what) + " from '" + api.path + "' (driver API version " +
      (api.version ? std::to_string(api.version) : std::string("unknown")) +
      "), but cuInit(0) failed with " + describe(api, result);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string fix;
  if (result == CUDA_ERROR_NO_DEVICE)
    fix = "no CUDA device: run on a machine with an NVIDIA GPU" +
          std::string(visible ? ", or check CUDA_VISIBLE_DEVICES (now '" + std::string(visible) +
                                    "')"
                              : "") +
          "; CPU work is unaffected";
  else if (result == CUDA_ERROR_STUB_LIBRARY)
    fix = "this libcuda is the CUDA toolkit's link-time stub (lib64/stubs), not the driver: take "
          "the stubs directory off LD_LIBRARY_PATH and install the NVIDIA driver";
  else
    fix = "check the NVIDIA driver installation (nvidia-smi should list the GPU)";
  FUSEBOX_THROW(backend_unavailable("CUDA", loaded, fix));
}

FUSEBOX_RUNTIME_API const detail::driver_state& detail::driver_once() {
  // Never destroyed: see the header comment (libraries live as long as the process).
  static const driver_state* state = [] {
    // cuda::require_device (pipeline/targets.hpp): host code that must refuse a CUDA request
    // checks the device through it once this process has tried the driver.
    cuda::require_device = &require_device_here;
    auto* s = new driver_state;
    try {
      load_driver(*s);
    } catch (...) {
      s->failure = std::current_exception();
    }
    return s;
  }();
  return *state;
}

FUSEBOX_RUNTIME_API const driver_api& driver() {
  const auto& state = detail::driver_once();
  if (state.failure) std::rethrow_exception(state.failure);
  return state.api;
}

FUSEBOX_RUNTIME_API void check(CUresult result, std::string_view call, std::string_view context) {
  if (result == CUDA_SUCCESS) return;
  std::string what = "fusebox: " + std::string(call) + " failed with " +
                     detail::describe(detail::driver_once().api, result);
  if (!context.empty()) what += ": " + std::string(context);
  FUSEBOX_THROW(driver_error(what, result));
}

FUSEBOX_RUNTIME_API int detail::selected_ordinal(const driver_api& api) {
  int count = 0;
  check(api.device_get_count(&count), "cuDeviceGetCount");
  if (count == 0)
    FUSEBOX_THROW(backend_unavailable("CUDA", "libcuda reports no CUDA device",
                                      "run on a machine with an NVIDIA GPU; CPU work is unaffected"));
  const char* env = std::getenv("FUSEBOX_CUDA_DEVICE");
  if (!env || !*env) return 0;
  int ordinal = 0;
  for (const char* c = env; *c; ++c) {
    if (*c < '0' || *c > '9' || ordinal > 1000)
      FUSEBOX_THROW(invalid_argument("fusebox: FUSEBOX_CUDA_DEVICE='" + std::string(env) +
                                     "' is not a device ordinal; this machine has " +
                                     std::to_string(count) + " CUDA device(s), 0.." +
                                     std::to_string(count - 1)));
    ordinal = ordinal * 10 + (*c - '0');
  }
  if (ordinal >= count)
    FUSEBOX_THROW(invalid_argument("fusebox: FUSEBOX_CUDA_DEVICE=" + std::to_string(ordinal) +
                                   " but this machine has " + std::to_string(count) +
                                   " CUDA device(s), 0.." + std::to_string(count - 1)));
  return ordinal;
}

FUSEBOX_RUNTIME_API device_info detail::open_device() {
  const auto& api = driver();
  device_info info;
  info.ordinal = selected_ordinal(api);
  const std::string on = "device " + std::to_string(info.ordinal);
  check(api.device_get(&info.device, info.ordinal), "cuDeviceGet", on);
  char name[256] = {};
  check(api.device_get_name(name, sizeof name - 1, info.device), "cuDeviceGetName", on);
  info.name = name;
  auto attribute = [&](int which, const char* what) {
    int value = 0;
    check(api.device_get_attribute(&value, which, info.device), "cuDeviceGetAttribute",
          std::string(what) + " of " + on);
    return value;
  };
  info.sm_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major");
  info.sm_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor");
  info.sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count");
  info.max_shared_bytes_optin =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "opt-in shared memory");
  info.arch = "sm_" + std::to_string(info.sm_major) + std::to_string(info.sm_minor);
  check(api.device_primary_ctx_retain(&info.context, info.device), "cuDevicePrimaryCtxRetain",
        on + " (" + info.name + ")");
  return info;
}

FUSEBOX_RUNTIME_API const detail::device_state& detail::device_once() {
  static const device_state* state = [] {
    auto* s = new device_state;  // never destroyed, like the driver table
    try {
      s->info = open_device();
    } catch (...) {
      s->failure = std::current_exception();
    }
    return s;
  }();
  return *state;
}

FUSEBOX_RUNTIME_API const device_info& current_device() {
  const auto& state = detail::device_once();
  if (state.failure) std::rethrow_exception(state.failure);
  const auto& api = driver();
  CUcontext now = nullptr;
  check(api.ctx_get_current(&now), "cuCtxGetCurrent");
  if (now != state.info.context)
    check(api.ctx_set_current(state.info.context), "cuCtxSetCurrent",
          "primary context of device " + std::to_string(state.info.ordinal));
  return state.info;
}

FUSEBOX_RUNTIME_API bool available() noexcept {
  try {
    detail::selected_ordinal(driver());
    return true;
  } catch (...) {
    return false;
  }
}
#endif

}  // namespace fusebox::cuda
