// TextStream (see text_stream.h).
#include "text_stream.h"

#include <algorithm>
#include <utility>

namespace polykv::python {

size_t CompleteUtf8Prefix(const std::string& s) {
  const size_t n = s.size();
  // Walk back over at most 3 continuation bytes (10xxxxxx) to the last lead byte.
  size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 4) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) break;
    --i;
    ++cont;
  }
  if (i == 0) return n;
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t len = 1;
  if ((lead & 0xE0) == 0xC0) {
    len = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
  }
  // An unfinished sequence at the end: leave it out.
  if (len > 1 && static_cast<size_t>(cont) + 1 < len) return i - 1;
  return n;
}

TextStream::TextStream(DecodeFn decode, std::vector<std::string> stops)
    : decode_(std::move(decode)) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::Emit(size_t end, const std::string& full) {
  if (end <= emitted_.size()) return "";
  std::string piece = full.substr(emitted_.size(), end - emitted_.size());
  emitted_ += piece;
  return piece;
}

std::string TextStream::Push(int32_t token) {
  if (stopped_) return "";
  ids_.push_back(token);
  const std::string full = decode_(ids_);
  // The earliest stop string in the text not handed out yet (held back text included).
  size_t cut = std::string::npos;
  const size_t from = emitted_.size();
  for (const std::string& s : stops_) {
    const size_t p = full.find(s, from);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    return Emit(cut, full);
  }
  size_t end = CompleteUtf8Prefix(full);
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, end - std::min(end, from)); k > hold; --k) {
      if (full.compare(end - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return Emit(end - hold, full);
}

std::string TextStream::Finish() {
  if (stopped_ || ids_.empty()) return "";
  const std::string full = decode_(ids_);
  return Emit(full.size(), full);
}

}  // namespace polykv::python
