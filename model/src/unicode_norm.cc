// NFC normalization over the generated tables of unicode_nfc.cc and unicode_nfc_compose.cc.
#include <algorithm>
#include <vector>

#include "unicode_data.h"
#include "unicode_nfc.h"
#include "unicode_tables.h"

namespace polykv::model::unicode {
namespace {

using tables::kCodePointBits;

// Hangul syllable arithmetic (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Invalid-byte markers from DecodeUtf8 are above U+10FFFF: starters that never compose.
void Decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  uint64_t parts = 0;
  if (!tables::FindPacked(tables::kDecomp, tables::kDecompCount, cp, 2 * kCodePointBits, &parts)) {
    out->push_back(cp);
    return;
  }
  const uint32_t mask = (1u << kCodePointBits) - 1;
  Decompose(static_cast<uint32_t>(parts >> kCodePointBits), out);
  const uint32_t second = static_cast<uint32_t>(parts) & mask;
  if (second != 0) Decompose(second, out);
}

// Primary composite of (a, b), or 0.
uint32_t Compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  uint64_t composite = 0;
  const uint64_t key = (uint64_t{a} << kCodePointBits) | b;
  return tables::FindPacked(tables::kCompose, tables::kComposeCount, key, kCodePointBits,
                            &composite)
             ? static_cast<uint32_t>(composite)
             : 0;
}

}  // namespace

uint8_t CombiningClass(uint32_t cp) {
  return cp > 0x10FFFF ? 0 : tables::RangeValue(tables::kCcc, tables::kCccCount, cp);
}

std::string NormalizeNfc(std::string_view text) {
  // Quick check: text without code points from U+0300 up is already NFC.
  bool simple = true;
  for (unsigned char c : text) {
    if (c >= 0xCC) {  // lead bytes of U+0300 and above
      simple = false;
      break;
    }
  }
  if (simple) return std::string(text);

  const CodePoints cps = DecodeUtf8(text);
  // 1. Full canonical decomposition.
  std::vector<uint32_t> d;
  d.reserve(cps.cps.size() + 8);
  for (uint32_t cp : cps.cps) {
    if (cp > 0x10FFFF) {
      d.push_back(cp);
    } else {
      Decompose(cp, &d);
    }
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  std::vector<uint8_t> cls(d.size());
  for (size_t i = 0; i < d.size(); ++i) cls[i] = d[i] > 0x10FFFF ? 0 : CombiningClass(d[i]);
  for (size_t i = 0; i < d.size();) {
    if (cls[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && cls[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint8_t, uint32_t>> run;
      for (size_t k = i; k < j; ++k) run.push_back({cls[k], d[k]});
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = i; k < j; ++k) {
        cls[k] = run[k - i].first;
        d[k] = run[k - i].second;
      }
    }
    i = j;
  }
  // 3. Canonical composition.
  std::vector<uint32_t> out;
  out.reserve(d.size());
  size_t starter = 0;
  bool have_starter = false;
  int last_class = -1;  // class of the last character appended after the starter
  for (size_t i = 0; i < d.size(); ++i) {
    const uint32_t c = d[i];
    const int k = cls[i];
    if (have_starter && c <= 0x10FFFF) {
      // Not blocked: nothing between the starter and c, or the last one has a lower class.
      const bool adjacent = out.size() == starter + 1;
      if (adjacent || (last_class != 0 && last_class < k)) {
        const uint32_t comp = Compose(out[starter], c);
        if (comp != 0) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (k == 0) {
      have_starter = c <= 0x10FFFF;
      starter = out.size();
      last_class = -1;
    } else {
      last_class = k;
    }
    out.push_back(c);
  }
  // Back to UTF-8; markers become their original bytes.
  std::string r;
  r.reserve(text.size());
  for (uint32_t cp : out) {
    if (cp > 0x10FFFF) {
      r += static_cast<char>(cp - 0x110000);
    } else {
      r += EncodeUtf8(cp);
    }
  }
  return r;
}

}  // namespace polykv::model::unicode
