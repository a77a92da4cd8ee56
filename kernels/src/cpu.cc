// CPU feature detection (CPUID + XGETBV) and the compute thread count of the fast kernels.
#include "polykv/kernels/cpu.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "polykv/enum_names.h"
#include "thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace polykv::kernels {
namespace {

constexpr EnumName<Isa> kIsaNames[] = {
    {Isa::kScalar, "scalar"}, {Isa::kAvx2, "avx2"}, {Isa::kAvx512, "avx512"}};

struct Features {
  bool avx2 = false;
  bool avx512 = false;
  bool amx_int8 =
      false;  ///< CPUID AMX-TILE + AMX-INT8 and XCR0 tile state (not yet the permission)
};

#if defined(__x86_64__) || defined(__i386__)
uint64_t Xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

Features Detect() {
  Features f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1,
             avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = Xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = (b >> 5) & 1, bmi2 = (b >> 8) & 1;
  const bool avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1,
             avx512vl = (b >> 31) & 1, avx512vnni = (c >> 11) & 1;
  f.avx2 = ymm_state && avx2 && fma && f16c && bmi2;
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  const bool amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1, avx512vbmi = (c >> 1) & 1;
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG (17) + XTILEDATA (18)
  // The AMX sources also use AVX512-VBMI (packed key codes), which every AMX CPU has.
  f.amx_int8 = f.avx512 && avx512vbmi && amx_tile && amx_int8 && tile_state;
#endif
  return f;
}

const Features& Cpu() {
  static const Features f = Detect();
  return f;
}

bool CompiledIn(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#ifdef POLYKV_HAVE_AVX2_KERNELS
      return true;
#else
      return false;
#endif
    case Isa::kAvx512:
#ifdef POLYKV_HAVE_AVX512_KERNELS
      return true;
#else
      return false;
#endif
  }
  return false;
}

std::atomic<int> g_threads{0};

Isa ComputeBest() {
  Isa best = Isa::kScalar;
  for (Isa i : {Isa::kAvx2, Isa::kAvx512})
    if (IsaSupported(i)) best = i;
  const char* env = std::getenv("POLYKV_ISA");
  if (env != nullptr && env[0] != '\0') {
    auto want = ParseIsa(env);
    if (!want.ok()) {
      std::fprintf(stderr, "polykv: ignoring POLYKV_ISA: %s\n",
                   std::string(want.status().message()).c_str());
    } else if (!IsaSupported(*want)) {
      std::fprintf(stderr, "polykv: POLYKV_ISA=%s is not supported by this CPU; using %s\n", env,
                   IsaName(best));
    } else {
      best = *want;
    }
  }
  return best;
}

}  // namespace

const char* IsaName(Isa isa) { return EnumToName(kIsaNames, isa); }

StatusOr<Isa> ParseIsa(const std::string& name) {
  if (auto isa = EnumFromName(kIsaNames, name)) return *isa;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ISA '", name, "' (expected ", EnumNameList(kIsaNames), ")"));
}

bool IsaSupported(Isa isa) {
  if (!CompiledIn(isa)) return false;
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return Cpu().avx2;
    case Isa::kAvx512:
      return Cpu().avx512;
  }
  return false;
}

bool AmxInt8Supported() {
  static const bool ok = [] {
#if defined(POLYKV_HAVE_AMX_KERNELS) && defined(__linux__) && defined(__x86_64__)
    if (!IsaSupported(Isa::kAvx512) || !Cpu().amx_int8) return false;
    const char* env = std::getenv("POLYKV_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    // Linux >= 5.16 hands the tile data state out on request only (else SIGILL on first use).
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

Isa BestIsa() {
  static const Isa best = ComputeBest();
  return best;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (IsaSupported(i)) out.push_back(i);
  return out;
}

void SetComputeThreads(int n) { g_threads.store(n < 1 ? 0 : n); }

int ComputeThreads() {
  const int n = g_threads.load();
  if (n >= 1) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void ParallelTasks(int64_t tasks, const std::function<void(int64_t)>& fn) {
  internal::RunTasks(tasks, ComputeThreads(), fn);
}

}  // namespace polykv::kernels
