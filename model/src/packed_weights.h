// The mapped model's matrices in the kernels' decode panel layout (kernels::PackWeights),
// kept in ONE file per model and user that every process maps read-only, so N agents share
// one copy in the page cache and none holds a private one.
#pragma once

#include <string>

#include "llama_internal.h"
#include "polykv/status.h"

namespace polykv::model::internal {

/// The folder of the packed-weights files: $POLYKV_PACKED_CACHE, else
/// $XDG_CACHE_HOME/polykv/packed, else $HOME/.cache/polykv/packed; "" when none is set
/// or $POLYKV_PACKED_CACHE is "0" (packed weights off).
std::string PackedWeightsDir();

/// Sets MappedMatrix::w.packed of every matrix of `w` whose type has a packed layout
/// (kernels::PackedLayoutSupported), where the CPU runs the kernels that read it (the avx512
/// variant): maps `dir`/<fingerprint>-<layout>.bin, first writing it when absent (a
/// temporary file in `dir`, flushed, then renamed: readers never see a partial one). The
/// folder is created 0700 and the file must belong to this user and be writable by no one
/// else; a file whose size or header does not match this model's matrices is replaced.
/// The mapping is kept alive in w.files. Returns a one-line description ("packed: <path>",
/// or "blocks: <why not>"). Errors (the weights are left as they were, and the model works
/// from the blocks): kFailedPrecondition / kPermissionDenied / kResourceExhausted / kInternal
/// naming the file and the failing step.
StatusOr<std::string> AttachPackedWeights(MappedWeights& w, const std::string& fingerprint,
                                          const std::string& dir);

}  // namespace polykv::model::internal
