// Device-neutral entry points of the agent-step kernels (device_ops.h): host-side checks,
// then the CPU kernels or the CUDA launchers (device_cuda.h) and cuBLAS.
#include "polykv/kernels/device_ops.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "polykv/kernels/block_math.h"
#include "polykv/kernels/ops.h"
#include "polykv/kernels/sampling.h"
#if defined(POLYKV_HAVE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <map>
#include <type_traits>

#include "device_cuda.h"
#include "polykv/cuda_status.h"
#endif

namespace polykv::kernels {

static_assert(blocks::kF32 == static_cast<uint32_t>(WeightType::kF32) &&
                  blocks::kF16 == static_cast<uint32_t>(WeightType::kF16) &&
                  blocks::kBF16 == static_cast<uint32_t>(WeightType::kBF16) &&
                  blocks::kQ4_0 == static_cast<uint32_t>(WeightType::kQ4_0) &&
                  blocks::kQ4_1 == static_cast<uint32_t>(WeightType::kQ4_1) &&
                  blocks::kQ5_0 == static_cast<uint32_t>(WeightType::kQ5_0) &&
                  blocks::kQ5_1 == static_cast<uint32_t>(WeightType::kQ5_1) &&
                  blocks::kQ8_0 == static_cast<uint32_t>(WeightType::kQ8_0),
              "block_math.h type numbers are WeightType's");

namespace {

#if defined(POLYKV_HAVE_CUDA)
struct DeviceProbe {
  int count = 0;
  std::string why;  ///< empty when count > 0
};

const DeviceProbe& Probe() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
    const cudaError_t e = cudaGetDeviceCount(&p.count);
    if (e != cudaSuccess) {
      p.count = 0;
      p.why = absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(e), ": ",
                           cudaGetErrorString(e));
      cudaGetLastError();  // clear the error so that later calls do not report it
    } else if (p.count == 0) {
      p.why = "cudaGetDeviceCount reports 0 devices";
    }
    return p;
  }();
  return probe;
}

cudaStream_t CudaStream(Stream s) { return static_cast<cudaStream_t>(s); }

// cuBLAS is opened on first use (dlopen of the soname this build was compiled against), not
// linked: linking it costs every process that loads the kernels ~80 ms of relocations and
// static initialisers at start (an agent on the CPU, `polykv-cli ping`), for a library only
// products of more than 16 rows on a GPU call.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  // The C entry point (C++ code also sees an inline overload taking a cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string error;  ///< why it could not be opened (empty when it was)
};

#define POLYKV_CUBLAS_SONAME_(major) "libcublas.so." #major
#define POLYKV_CUBLAS_SONAME(major) POLYKV_CUBLAS_SONAME_(major)

const CublasApi& Cublas() {
  static const CublasApi api = [] {
    CublasApi a;
    const char* soname = POLYKV_CUBLAS_SONAME(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      a.error = absl::StrCat("cannot open ", soname, ": ", e != nullptr ? e : "unknown error");
      return a;
    }
    const auto get = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (*fn == nullptr && a.error.empty())
        a.error = absl::StrCat(soname, " has no symbol ", name);
    };
    get(&a.create, "cublasCreate_v2");
    get(&a.destroy, "cublasDestroy_v2");
    get(&a.set_stream, "cublasSetStream_v2");
    get(&a.set_math_mode, "cublasSetMathMode");
    get(&a.sgemm, "cublasSgemm_v2");
    get(&a.gemm_ex, "cublasGemmEx");
    get(&a.status_name, "cublasGetStatusName");
    get(&a.status_string, "cublasGetStatusString");
    return a;  // the library stays open for the life of the process
  }();
  return api;
}

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const CublasApi& api = Cublas();
  const std::string msg =
      absl::StrCat(what, ": cuBLAS error ", api.status_name(s), ": ", api.status_string(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// One cuBLAS handle per (thread, device), created on first use and destroyed with the thread.
class BlasHandles {
 public:
  ~BlasHandles() {
    for (auto& [dev, h] : handles_) Cublas().destroy(h);
  }
  StatusOr<cublasHandle_t> Get(cudaStream_t stream) {
    int dev = 0;
    POLYKV_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&dev), "cudaGetDevice"));
    const CublasApi& api = Cublas();
    if (!api.error.empty())
      return absl::FailedPreconditionError(absl::StrCat("cuBLAS: ", api.error));
    auto it = handles_.find(dev);
    if (it == handles_.end()) {
      cublasHandle_t h = nullptr;
      POLYKV_RETURN_IF_ERROR(CublasStatus(api.create(&h), "cublasCreate"));
      it = handles_.emplace(dev, h).first;
    }
    POLYKV_RETURN_IF_ERROR(CublasStatus(api.set_stream(it->second, stream), "cublasSetStream"));
    return it->second;
  }

 private:
  std::map<int, cublasHandle_t> handles_;
};

StatusOr<cublasHandle_t> ThreadBlas(cudaStream_t stream) {
  thread_local BlasHandles handles;
  return handles.Get(stream);
}

// y = x W^T with cuBLAS (column-major view: Y^T [rows x n] = W [cols x rows]^T X^T [cols x n]).
Status BlasMatMul(const WeightView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                  int64_t y_stride, cudaStream_t stream) {
  if (w.rows > INT32_MAX || w.cols > INT32_MAX || n > INT32_MAX || x_stride > INT32_MAX ||
      y_stride > INT32_MAX)
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceMatMul: cuBLAS sizes must fit int32 (rows ", w.rows, ", cols ", w.cols,
                     ", n ", n, ")"));
  POLYKV_ASSIGN_OR_RETURN(cublasHandle_t h, ThreadBlas(stream));
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols), nn = static_cast<int>(n);
  const float alpha = 1.0f, beta = 0.0f;
  if (w.type == WeightType::kF32) {
    POLYKV_RETURN_IF_ERROR(
        CublasStatus(Cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    return CublasStatus(
        Cublas().sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha,
                       static_cast<const float*>(w.data), k, x, static_cast<int>(x_stride), &beta,
                       y, static_cast<int>(y_stride)),
        "cublasSgemm");
  }
  // F16 / BF16: the activations rounded to the weight's type, f32 accumulation and output.
  const bool f16 = w.type == WeightType::kF16;
  return WithStreamScratch(
      sizeof(uint16_t) * static_cast<size_t>(n * w.cols), stream, "16-bit activations",
      [&](void* xh) -> Status {
        POLYKV_RETURN_IF_ERROR(
            CudaStatus(cuda::InvokeConvertRows(x, n, w.cols, x_stride, f16 ? 1 : 2, xh, stream),
                       "f32 -> 16-bit rows kernel"));
        const cudaDataType_t t = f16 ? CUDA_R_16F : CUDA_R_16BF;
        return CublasStatus(
            Cublas().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, t, k, xh, t, k,
                             &beta, y, CUDA_R_32F, static_cast<int>(y_stride), CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      });
}
#endif  // POLYKV_HAVE_CUDA

Status CheckWeight(const WeightView& w, const char* what) {
  if (w.rows < 1 || w.cols < 1 || w.data == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(what, ": weight view of ", w.rows, " x ", w.cols,
                                                   (w.data == nullptr ? " (null)" : "")));
  auto fmt = WeightBlockFormat(w.type);
  if (!fmt.ok()) return fmt.status();
  if (w.cols % fmt->values != 0 || w.row_bytes != w.cols / fmt->values * fmt->bytes)
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", WeightTypeName(w.type), " view with cols ", w.cols,
                     " and row_bytes ", w.row_bytes, " is not a whole number of blocks"));
  return absl::OkStatus();
}

Status CheckCudaType(const WeightView& w, const char* what) {
  if (!DeviceWeightTypeSupported(w.type))
    return absl::UnimplementedError(absl::StrCat(what, ": weight type ", WeightTypeName(w.type),
                                                 " has no CUDA kernels (F32, F16, BF16, Q4_0, "
                                                 "Q4_1, Q5_0, Q5_1, Q8_0 have)"));
  return absl::OkStatus();
}

Status CheckPtrs(const char* what, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null pointer"));
  return absl::OkStatus();
}

Status CheckCount(const char* what, const char* name, int64_t v, int64_t min) {
  if (v < min)
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " must be >= ", min, ", got ", v));
  return absl::OkStatus();
}

// The kCuda branch: `statement` in CUDA builds (after CheckDeviceAvailable has passed);
// elsewhere CheckDeviceAvailable has already refused kCuda.
#if defined(POLYKV_HAVE_CUDA)
#define POLYKV_DEVICE_CUDA(...) __VA_ARGS__
#else
#define POLYKV_DEVICE_CUDA(...) \
  (void)stream;                 \
  return absl::InternalError("CUDA branch reached in a build without CUDA")
#endif

}  // namespace

int CudaDeviceCount() {
#if defined(POLYKV_HAVE_CUDA)
  return Probe().count;
#else
  return 0;
#endif
}

Status CheckDeviceAvailable(Device device) {
  if (device == Device::kCpu) return absl::OkStatus();
  if (device != Device::kCuda)
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device ", static_cast<int>(device), " (kCpu 0, kCuda 1)"));
#if defined(POLYKV_HAVE_CUDA)
  if (Probe().count > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("Device::kCuda requested but no CUDA device is usable: ", Probe().why));
#else
  return absl::UnimplementedError(
      "Device::kCuda requested but PolyKV was built without CUDA (POLYKV_ENABLE_CUDA=OFF or no "
      "nvcc)");
#endif
}

bool DeviceWeightTypeSupported(WeightType type) {
  return blocks::DeviceTypeSupported(static_cast<uint32_t>(type));
}

Status DeviceMatMul(const WeightView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                    int64_t y_stride, Device device, Stream stream,
                    const DeviceMatMulOptions& options) {
  constexpr const char* kWhat = "DeviceMatMul";
  POLYKV_RETURN_IF_ERROR(CheckWeight(w, kWhat));
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "n", n, 0));
  if (x_stride < w.cols || y_stride < w.rows)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": x_stride ", x_stride, " < cols ",
                                                   w.cols, " or y_stride ", y_stride, " < rows ",
                                                   w.rows));
  if (n == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {x, y}));
  if (device == Device::kCuda) POLYKV_RETURN_IF_ERROR(CheckCudaType(w, kWhat));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    if (!options.accumulate) return MatMul(w, x, n, x_stride, y, y_stride, options.cpu);
    std::vector<float> t(static_cast<size_t>(n * w.rows));
    POLYKV_RETURN_IF_ERROR(MatMul(w, x, n, x_stride, t.data(), w.rows, options.cpu));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < w.rows; ++o) y[r * y_stride + o] += t[r * w.rows + o];
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA({
    const bool float_type =
        w.type == WeightType::kF32 || w.type == WeightType::kF16 || w.type == WeightType::kBF16;
    const bool blas = !options.accumulate && float_type &&
                      (options.blas == 1 || (options.blas < 0 && n > kDeviceMatVecMaxRows));
    if (blas) return BlasMatMul(w, x, n, x_stride, y, y_stride, CudaStream(stream));
    // Block-quantized weights and many rows (a prefill): the matrix dequantized to f32 once
    // (block_math.h, bit-exact with the CPU's DequantizeRows), then cublasSgemm, instead of
    // reading the blocks once per 16 rows.
    const bool quant_blas = !float_type && !options.accumulate &&
                            (options.blas == 1 || (options.blas < 0 && n >= kDeviceGemmMinRows));
    if (quant_blas) {
      cudaStream_t cs = CudaStream(stream);
      return WithStreamScratch(
          sizeof(float) * static_cast<size_t>(w.rows * w.cols), cs, "dequantized weights",
          [&](void* scratch) -> Status {
            auto* wf = static_cast<float*>(scratch);
            POLYKV_RETURN_IF_ERROR(
                CudaStatus(cuda::InvokeDequantizeRows(static_cast<uint32_t>(w.type), w.data, 0,
                                                      w.rows, w.cols, w.row_bytes, wf, cs),
                           "dequantize kernel"));
            WeightView f = w;
            f.type = WeightType::kF32;
            f.data = wf;
            f.row_bytes = w.cols * 4;
            return BlasMatMul(f, x, n, x_stride, y, y_stride, cs);
          });
    }
    for (int64_t r = 0; r < n; r += kDeviceMatVecMaxRows) {
      const int64_t m = std::min<int64_t>(kDeviceMatVecMaxRows, n - r);
      POLYKV_RETURN_IF_ERROR(CudaStatus(
          cuda::InvokeMatVec(static_cast<uint32_t>(w.type), w.data, w.rows, w.cols, w.row_bytes,
                             x + r * x_stride, m, x_stride, y + r * y_stride, y_stride,
                             options.accumulate, CudaStream(stream)),
          "matrix-vector kernel"));
    }
    return absl::OkStatus();
  });
}

Status DeviceDequantizeRows(const WeightView& w, int64_t begin, int64_t end, float* out,
                            Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceDequantizeRows";
  POLYKV_RETURN_IF_ERROR(CheckWeight(w, kWhat));
  if (begin < 0 || end > w.rows || begin > end)
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": rows [", begin, ", ", end, ") outside [0, ", w.rows, ")"));
  if (begin == end) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {out}));
  if (device == Device::kCuda) POLYKV_RETURN_IF_ERROR(CheckCudaType(w, kWhat));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) return DequantizeRows(w, begin, end, out);
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeDequantizeRows(static_cast<uint32_t>(w.type), w.data, begin, end, w.cols,
                                 w.row_bytes, out, CudaStream(stream)),
      "dequantize kernel"));
}

Status DeviceEmbedRows(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                       int64_t out_stride, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceEmbedRows";
  POLYKV_RETURN_IF_ERROR(CheckWeight(table, kWhat));
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "n", n, 0));
  if (out_stride < table.cols)
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": out_stride ", out_stride, " < cols ", table.cols));
  if (n == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {ids, out}));
  if (device == Device::kCuda) POLYKV_RETURN_IF_ERROR(CheckCudaType(table, kWhat));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    for (int64_t r = 0; r < n; ++r) {
      if (ids[r] < 0 || ids[r] >= table.rows)
        return absl::OutOfRangeError(absl::StrCat(kWhat, ": id ", ids[r], " at index ", r,
                                                  " is outside [0, ", table.rows, ")"));
      POLYKV_RETURN_IF_ERROR(DequantizeRows(table, ids[r], ids[r] + 1, out + r * out_stride));
    }
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeEmbedRows(static_cast<uint32_t>(table.type), table.data, table.rows, table.cols,
                            table.row_bytes, ids, n, out, out_stride, CudaStream(stream)),
      "embedding kernel"));
}

Status DeviceRmsNormRows(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                         float* out, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceRmsNormRows";
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "rows", rows, 0));
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "dim", dim, 1));
  if (!(eps >= 0.0f))
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": eps must be >= 0, got ", eps));
  if (rows > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": rows ", rows, " > 2^31-1"));
  if (rows == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {x, w, out}));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    RmsNormRows(x, w, rows, dim, eps, out);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeRmsNormRows(x, w, rows, dim, eps, out, CudaStream(stream)), "RMSNorm kernel"));
}

namespace {

// The checks of an element-wise op over `count` values: whether there is work (count > 0,
// then the pointers and the device are checked too).
StatusOr<bool> CheckElementwise(const char* what, int64_t count,
                                std::initializer_list<const void*> ptrs, Device device) {
  POLYKV_RETURN_IF_ERROR(CheckCount(what, "count", count, 0));
  if (count == 0) return false;
  POLYKV_RETURN_IF_ERROR(CheckPtrs(what, ptrs));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  return true;
}

}  // namespace

Status DeviceSiluMul(const float* gate, const float* up, int64_t count, float* out, Device device,
                     Stream stream) {
  POLYKV_ASSIGN_OR_RETURN(const bool work,
                          CheckElementwise("DeviceSiluMul", count, {gate, up, out}, device));
  if (!work) return absl::OkStatus();
  if (device == Device::kCpu) {
    SiluMul(gate, up, count, out);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeSiluMul(gate, up, count, out, CudaStream(stream)), "SiLU-gate kernel"));
}

Status DeviceAdd(const float* a, const float* b, int64_t count, float* out, Device device,
                 Stream stream) {
  POLYKV_ASSIGN_OR_RETURN(const bool work,
                          CheckElementwise("DeviceAdd", count, {a, b, out}, device));
  if (!work) return absl::OkStatus();
  if (device == Device::kCpu) {
    for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(
      return CudaStatus(cuda::InvokeAdd(a, b, count, out, CudaStream(stream)), "add kernel"));
}

Status DeviceAppendKvRows(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                          int32_t head_dim, float* cache, int64_t capacity, int64_t pos,
                          const int64_t* pos_device, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceAppendKvRows";
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "n", n, 0));
  if (kv_heads < 1 || head_dim < 1 || src_stride < int64_t{kv_heads} * head_dim)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": kv_heads ", kv_heads, ", head_dim ",
                                                   head_dim, ", src_stride ", src_stride));
  if (pos_device == nullptr && (pos < 0 || pos + n > capacity))
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": rows ", pos, " + ", n, " past the cache capacity ", capacity));
  if (n == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {src, cache}));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    const int64_t p0 = pos_device != nullptr ? *pos_device : pos;
    if (p0 < 0 || p0 + n > capacity)
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": rows ", p0, " + ", n, " past the cache capacity ", capacity));
    for (int64_t r = 0; r < n; ++r)
      for (int32_t h = 0; h < kv_heads; ++h)
        std::copy_n(src + r * src_stride + int64_t{h} * head_dim, head_dim,
                    cache + (int64_t{h} * capacity + p0 + r) * head_dim);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(
      return CudaStatus(cuda::InvokeAppendKvRows(src, n, src_stride, kv_heads, head_dim, cache,
                                                 capacity, pos, pos_device, CudaStream(stream)),
                        "append-KV kernel"));
}

Status DeviceAppendKvSlots(const float* src, int64_t n, int64_t src_stride, int32_t kv_heads,
                           int32_t head_dim, float* slab, int64_t slots, int64_t capacity,
                           const int32_t* row_slot, const int64_t* row_length, Device device,
                           Stream stream) {
  constexpr const char* kWhat = "DeviceAppendKvSlots";
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "n", n, 0));
  if (n > 65535 || kv_heads < 1 || head_dim < 1 || src_stride < int64_t{kv_heads} * head_dim ||
      slots < 1 || capacity < 1)
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": n ", n, " (<= 65535), kv_heads ", kv_heads, ", head_dim ", head_dim,
                     ", src_stride ", src_stride, ", slots ", slots, ", capacity ", capacity));
  if (n == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {src, slab}));
  if (row_slot == nullptr || row_length == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": null row_slot or row_length"));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t slot = row_slot[r], p = row_length[r] - 1;
      if (slot < 0 || slot >= slots || p < 0 || p >= capacity)
        return absl::OutOfRangeError(absl::StrCat(kWhat, ": row ", r, ": slot ", slot, " (of ",
                                                  slots, ") or position ", p, " (capacity ",
                                                  capacity, ") out of range"));
    }
    for (int64_t r = 0; r < n; ++r)
      for (int32_t h = 0; h < kv_heads; ++h)
        std::copy_n(src + r * src_stride + int64_t{h} * head_dim, head_dim,
                    slab + ((row_slot[r] * int64_t{kv_heads} + h) * capacity + row_length[r] - 1) *
                               head_dim);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeAppendKvSlots(src, n, src_stride, kv_heads, head_dim, slab, slots, capacity,
                                row_slot, row_length, CudaStream(stream)),
      "append-KV-slots kernel"));
}

Status DeviceRopeRows(float* x, int64_t n, int64_t row_stride, int32_t heads, int32_t head_dim,
                      const float* cos, const float* sin, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceRopeRows";
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "n", n, 0));
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "heads", heads, 1));
  if (head_dim < 2 || head_dim % 2 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": head_dim must be even and >= 2, got ", head_dim));
  if (row_stride < int64_t{heads} * head_dim)
    return absl::InvalidArgumentError(absl::StrCat(
        kWhat, ": row_stride ", row_stride, " < heads * head_dim ", int64_t{heads} * head_dim));
  if (n > 65535)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": n ", n, " > 65535 rows per call"));
  if (n == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {x, cos, sin}));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    for (int64_t r = 0; r < n; ++r)
      RopeHeads(x + r * row_stride, heads, head_dim, cos + r * head_dim, sin + r * head_dim);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeRopeRows(x, n, row_stride, heads, head_dim, cos, sin, CudaStream(stream)),
      "RoPE kernel"));
}

Status DeviceArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                        int32_t* ids, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceArgmaxRows";
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "rows", rows, 0));
  POLYKV_RETURN_IF_ERROR(CheckCount(kWhat, "vocab", vocab, 1));
  if (vocab > INT32_MAX || rows > INT32_MAX || stride < vocab)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": vocab ", vocab, ", rows ", rows,
                                                   ", stride ", stride,
                                                   " (vocab, rows < 2^31, stride >= vocab)"));
  if (rows == 0) return absl::OkStatus();
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {logits, ids}));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    for (int64_t r = 0; r < rows; ++r) ids[r] = ArgmaxLogits(logits + r * stride, vocab);
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeArgmaxRows(logits, rows, vocab, stride, ids, CudaStream(stream)),
      "argmax kernel"));
}

Status DeviceSampleTopP(const float* logits, int64_t vocab, float temperature, float top_p,
                        double u, int32_t* id, Device device, Stream stream) {
  constexpr const char* kWhat = "DeviceSampleTopP";
  if (vocab < 1 || vocab > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": vocab ", vocab, " (1..2^31-1)"));
  if (!(temperature > 0.0f))
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": temperature must be > 0, got ", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return absl::InvalidArgumentError(
        absl::StrCat(kWhat, ": top_p must be in (0, 1], got ", top_p));
  if (!(u >= 0.0 && u < 1.0))
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": u must be in [0, 1), got ", u));
  POLYKV_RETURN_IF_ERROR(CheckPtrs(kWhat, {logits, id}));
  POLYKV_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  if (device == Device::kCpu) {
    POLYKV_ASSIGN_OR_RETURN(*id, SampleTopP(logits, vocab, temperature, top_p, u));
    return absl::OkStatus();
  }
  POLYKV_DEVICE_CUDA(return CudaStatus(
      cuda::InvokeSampleTopP(logits, vocab, temperature, top_p, u, id, CudaStream(stream)),
      "top-p sampling kernels"));
}

}  // namespace polykv::kernels
