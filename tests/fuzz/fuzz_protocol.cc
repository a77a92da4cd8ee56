// libFuzzer target: the control-protocol decoder (what polykvd parses from any local peer,
// and what clients parse from the daemon). Beyond not crashing: every frame that decodes
// re-encodes to a frame that decodes to the same message, and an error reply can always be
// built for a frame that does not decode.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "polykv/ipc/protocol.h"

using polykv::ipc::DecodeReply;
using polykv::ipc::DecodeRequest;
using polykv::ipc::EncodeReply;
using polykv::ipc::EncodeRequest;
using polykv::ipc::MessageType;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto req = DecodeRequest(frame);
  if (req.ok()) {
    POLYKV_FUZZ_CHECK(polykv::ipc::ValidateRequest(*req).ok(), "decoded strings are UTF-8");
    const std::string again = EncodeRequest(*req);
    auto back = DecodeRequest(again);
    POLYKV_FUZZ_CHECK(back.ok(), "re-encoded request does not decode: %s",
                      std::string(back.status().message()).c_str());
    POLYKV_FUZZ_CHECK(back->type == req->type && back->id == req->id, "type/id changed");
    switch (req->type) {
      case MessageType::kCreatePool:
        POLYKV_FUZZ_CHECK(back->model == req->model && back->document == req->document &&
                              back->token_ids == req->token_ids && back->codec == req->codec &&
                              back->key_scale == req->key_scale && back->add_bos == req->add_bos,
                          "CREATE_POOL fields changed in a round trip");
        break;
      case MessageType::kAttach:
      case MessageType::kEvict:
        POLYKV_FUZZ_CHECK(back->pool_id == req->pool_id, "pool_id changed");
        break;
      case MessageType::kRenew:
      case MessageType::kDetach:
        POLYKV_FUZZ_CHECK(back->lease_id == req->lease_id, "lease_id changed");
        break;
      default:
        break;
    }
  } else {
    auto err = polykv::ipc::ErrorReplyForFrame(frame, req.status());
    POLYKV_FUZZ_CHECK(!err.ok && !err.code.empty(), "error reply without a code");
    POLYKV_FUZZ_CHECK(err.error.size() <= polykv::ipc::kMaxErrorBytes + 32, "error not capped");
    POLYKV_FUZZ_CHECK(DecodeReply(EncodeReply(err)).ok(), "error reply does not decode");
  }
  auto reply = DecodeReply(frame);
  if (reply.ok()) {
    auto back = DecodeReply(EncodeReply(*reply));
    POLYKV_FUZZ_CHECK(back.ok(), "re-encoded reply does not decode: %s",
                      std::string(back.status().message()).c_str());
    POLYKV_FUZZ_CHECK(
        back->type == reply->type && back->id == reply->id && back->instance == reply->instance,
        "reply envelope changed");
    if (reply->type != MessageType::kProgress) {
      POLYKV_FUZZ_CHECK(back->ok == reply->ok, "ok changed");
      if (reply->ok) {
        POLYKV_FUZZ_CHECK(back->pools.size() == reply->pools.size() &&
                              back->pool.has_value() == reply->pool.has_value() &&
                              back->memory.has_value() == reply->memory.has_value() &&
                              back->lease_id == reply->lease_id,
                          "reply fields changed");
      }
    }
  }
  return 0;
}
