// The AMX tile configuration block (Intel SDM, LDTILECFG memory layout, palette 1), shared by
// the sources compiled with AMX flags (matmul_amx.cc, attention_amx.cc). Plain data only.
#pragma once

#include <cstdint>

namespace polykv::kernels::amx {

/// rows[t] x colsb[t] bytes of tile t; unused tiles stay 0 x 0.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace polykv::kernels::amx
