// TextStream: the text of a generation as it streams: decodes the answer so far after every
// token, hands out only whole UTF-8 characters, holds back text that may begin a stop string,
// and cuts the answer before the first stop string that appears.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace polykv::python {

/// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence (bytes of
/// an unfinished multi-byte character at the end are left out; nothing else is checked).
size_t CompleteUtf8Prefix(const std::string& s);

/// Incremental text of a token stream. Not thread-safe (one generation thread).
class TextStream {
 public:
  /// Decodes a whole answer's ids to bytes (PooledAgent::DecodeText).
  using DecodeFn = std::function<std::string(const std::vector<int32_t>&)>;
  /// `stops`: strings that end the answer (empty ones are ignored).
  TextStream(DecodeFn decode, std::vector<std::string> stops);

  /// Adds the next token; returns the text that became final with it (possibly ""). Once
  /// a stop string appeared, stopped() is true and later tokens add nothing.
  std::string Push(int32_t token);
  /// At the end of the generation: the text held back so far (unless stopped), including an
  /// unfinished UTF-8 sequence as it is.
  std::string Finish();

  bool stopped() const { return stopped_; }
  /// Everything handed out (Push + Finish): the answer, cut before the stop string.
  const std::string& text() const { return emitted_; }
  /// Every token pushed (the one that completed a stop string included).
  const std::vector<int32_t>& tokens() const { return ids_; }

 private:
  std::string Emit(size_t end, const std::string& full);

  DecodeFn decode_;
  std::vector<std::string> stops_;
  std::vector<int32_t> ids_;
  std::string emitted_;
  bool stopped_ = false;
};

}  // namespace polykv::python
