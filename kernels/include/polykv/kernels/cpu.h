// CPU features and compute threads of the fast CPU kernels (matrix products over weight
// blocks, attention over the compressed pool).
//
// SIMD variants are chosen at run time from CPUID (and XGETBV for the OS-enabled register
// state): a variant the CPU lacks is never executed. Every variant is tested against the
// plain scalar reference (tests/unit/kernels/matmul_test.cc, attention_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "polykv/status.h"

namespace polykv::kernels {

/// Instruction-set variants of the CPU kernels, in increasing capability.
enum class Isa : int {
  kScalar = 0,  ///< plain C++ reference (always present)
  kAvx2 = 1,    ///< AVX2 + FMA + F16C
  kAvx512 = 2,  ///< AVX-512 F/BW/DQ/VL + VNNI (vpdpbusd)
};

/// "scalar", "avx2" or "avx512".
const char* IsaName(Isa isa);

/// Parses "scalar" / "avx2" / "avx512"; kInvalidArgument naming the text otherwise.
[[nodiscard]] StatusOr<Isa> ParseIsa(const std::string& name);

/// Whether this CPU (and OS) can execute `isa` (CPUID leaf 7 + XGETBV); cached.
bool IsaSupported(Isa isa);

/// The best supported variant, or the one named by $POLYKV_ISA when set and supported
/// (a named variant the CPU lacks falls back to the best supported one, with a warning on
/// stderr once). Cached after the first call.
Isa BestIsa();

/// Whether the AMX-INT8 tile kernels of the matrix products can run here: compiled in, the
/// CPU has AMX-TILE and AMX-INT8 with AVX-512 (Isa::kAvx512), the OS enables the tile state
/// (XCR0 bits 17 and 18) and granted this process the tile data state (Linux
/// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), requested once). $POLYKV_AMX=0
/// turns them off for the process (for comparisons). Cached after the first call.
bool AmxInt8Supported();

/// Every variant this CPU can execute, scalar first.
std::vector<Isa> SupportedIsas();

/// Sets the number of threads of the matrix and attention kernels (n < 1: all hardware
/// threads). Thread-safe; applies to calls that start afterwards.
void SetComputeThreads(int n);

/// Threads of the matrix and attention kernels (>= 1).
int ComputeThreads();

/// Runs fn(t) for every t in [0, tasks) on up to ComputeThreads() threads of the kernels'
/// pool, the calling thread included; blocks until all are done. Tasks are claimed one at a
/// time from a shared counter, so a descheduled thread delays only the task it holds, and at
/// most ComputeThreads() tasks run at once. fn must not throw. A ParallelTasks call or a
/// parallel kernel started inside fn runs inline on that thread; calls from several
/// threads at once are serialized.
void ParallelTasks(int64_t tasks, const std::function<void(int64_t)>& fn);

}  // namespace polykv::kernels
