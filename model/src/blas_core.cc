// Corrects OpenBLAS's kernel choice at start-up, for every executable that links the model
// library (this object is linked into each of them, see model/CMakeLists.txt).
//
// Why: libtorch multiplies matrices through OpenBLAS, whose DYNAMIC_ARCH build picks its
// kernels from the CPU's model number when it is loaded. Debian 12's OpenBLAS 0.3.21 does not
// know recent Xeons (e.g. family 6 model 207) and falls back to its SSE3 "Prescott" kernels,
// 2.4x slower for the prefill GEMM on the development machine (bench_model). OpenBLAS reads
// OPENBLAS_CORETYPE only in its own constructor, which runs before ours, so this constructor
// sets the variable and re-runs OpenBLAS's dynamic-arch selection (gotoblas_dynamic_quit +
// gotoblas_dynamic_init, exported by every DYNAMIC_ARCH build) before any BLAS call.
//
// Rule: nothing happens when OPENBLAS_CORETYPE is set (a user's choice always wins), when
// POLYKV_KEEP_BLAS_CORETYPE is set, when OpenBLAS is not loaded or not a DYNAMIC_ARCH build,
// or when OpenBLAS already picked a kernel family with AVX2 or better. Otherwise a CPU with
// AVX-512 F/BW/DQ/VL (and OS support) gets "SkylakeX", one with AVX2 + FMA "Haswell".
#include <cpuid.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

uint64_t Xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

const char* WantedCore() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return nullptr;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
  if (!osxsave || !avx) return nullptr;
  const uint64_t xcr0 = Xcr0();
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  if (avx512 && (xcr0 & 0xe6) == 0xe6) return "SkylakeX";
  if (avx2 && fma && (xcr0 & 0x6) == 0x6) return "Haswell";
  return nullptr;
}

// OpenBLAS kernel families older than AVX2 (its generic fallbacks for unknown CPUs).
bool PreAvx2(const char* core) {
  static const char* const kOld[] = {"Prescott",   "Core2",     "Penryn",      "Dunnington",
                                     "Nehalem",    "Atom",      "Sandybridge", "Katmai",
                                     "Coppermine", "Northwood", "Banias",      "Unknown"};
  for (const char* o : kOld)
    if (std::strcmp(core, o) == 0) return true;
  return false;
}

__attribute__((constructor)) void FixBlasCore() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr ||
      std::getenv("POLYKV_KEEP_BLAS_CORETYPE") != nullptr)
    return;
  using NameFn = char* (*)();
  using VoidFn = void (*)();
  auto name = reinterpret_cast<NameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto quit = reinterpret_cast<VoidFn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<VoidFn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (name == nullptr || quit == nullptr || init == nullptr) return;
  const char* core = name();
  if (core == nullptr || !PreAvx2(core)) return;
  const char* want = WantedCore();
  if (want == nullptr) return;
  setenv("OPENBLAS_CORETYPE", want, 0);
  quit();
  init();
}

}  // namespace
