// The evaluation's codec specs are the pools' (polykv/ipc/codec_spec.h).
#pragma once

#include "polykv/ipc/codec_spec.h"

namespace polykv::eval {

using ipc::CodecSpec;
using ipc::kDefaultCodecSpec;
using ipc::ParseCodecList;
using ipc::ParseCodecSpec;
using ipc::PoolSize;
using ipc::PoolSizeOf;

}  // namespace polykv::eval
