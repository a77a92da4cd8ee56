// The one table of ggml tensor types: the numbers of ggml.h (as GGUF tensor infos store
// them) with each type's name and block size (ggml.c type_traits). WeightType (matmul.h)
// names the types that have matrix kernels; the GGUF reader (model/) names and sizes every
// tensor from this table.
#pragma once

#include <cstdint>

namespace polykv::kernels {

/// One ggml tensor type.
struct GgmlTypeInfo {
  uint32_t id;           ///< ggml.h type number (GGUF tensor info `type`)
  const char* name;      ///< "F32", "Q4_1", "IQ2_XXS", ...
  int32_t block_values;  ///< values per block; 0 = a type whose size PolyKV does not know
  int32_t block_bytes;   ///< bytes per block (0 with block_values 0)
};

/// Every ggml type number PolyKV recognizes, in increasing id; other numbers are unknown.
inline constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},    {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 0, 0},  {17, "IQ2_XS", 0, 0},
    {18, "IQ3_XXS", 0, 0},  {19, "IQ1_S", 0, 0},    {20, "IQ4_NL", 0, 0},   {21, "IQ3_S", 0, 0},
    {22, "IQ2_S", 0, 0},    {23, "IQ4_XS", 0, 0},   {24, "I8", 1, 1},       {25, "I16", 1, 2},
    {26, "I32", 1, 4},      {27, "I64", 1, 8},      {28, "F64", 1, 8},      {29, "IQ1_M", 0, 0},
    {30, "BF16", 1, 2},     {34, "TQ1_0", 0, 0},    {35, "TQ2_0", 0, 0},    {39, "MXFP4", 0, 0},
};

/// The row of ggml type number `id`, or nullptr for a number not in kGgmlTypes.
constexpr const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const GgmlTypeInfo& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

}  // namespace polykv::kernels
