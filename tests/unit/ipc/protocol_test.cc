// Control protocol: round trips, and rejection of malformed/wrong/oversized frames.
#include "polykv/ipc/protocol.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "support/pool_info.h"

namespace polykv::ipc {
namespace {

TEST(ProtocolTest, MessageTypeNamesRoundTrip) {
  for (MessageType t :
       {MessageType::kCreatePool, MessageType::kAttach, MessageType::kRenew, MessageType::kDetach,
        MessageType::kList, MessageType::kStats, MessageType::kEvict, MessageType::kPing,
        MessageType::kProgress, MessageType::kError}) {
    auto parsed = ParseMessageType(MessageTypeName(t));
    ASSERT_TRUE(parsed.ok()) << MessageTypeName(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(MessageTypeName(MessageType::kCreatePool), "CREATE_POOL");
  EXPECT_EQ(ParseMessageType("BOGUS").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProtocolTest, CreatePoolRequestRoundTrip) {
  Request r;
  r.type = MessageType::kCreatePool;
  r.id = 42;
  r.model = "tests/data/models/stories260K";
  r.document = "Once upon a time \xe2\x80\x94 there was a \"quoted\" word.\n";
  r.token_ids = {1, 461, 0, 2147483647};
  r.add_bos = false;
  r.codec = "k8v2";
  r.key_scale = "channel";
  r.norm_correction = true;
  r.progress = true;
  r.parent = "0123abcd";
  auto d = DecodeRequest(EncodeRequest(r));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->parent, "0123abcd");
  // A child pool's create may leave the model to the daemon (the parent's); a root may not.
  Request child = r;
  child.model.clear();
  EXPECT_TRUE(DecodeRequest(EncodeRequest(child)).ok());
  child.parent.clear();
  EXPECT_EQ(DecodeRequest(EncodeRequest(child)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->type, MessageType::kCreatePool);
  EXPECT_EQ(d->id, 42u);
  EXPECT_EQ(d->model, r.model);
  EXPECT_EQ(d->document, r.document);
  EXPECT_EQ(d->token_ids, r.token_ids);
  EXPECT_FALSE(d->add_bos);
  EXPECT_EQ(d->codec, "k8v2");
  EXPECT_EQ(d->key_scale, "channel");
  EXPECT_TRUE(d->norm_correction);
  EXPECT_TRUE(d->progress);
}

TEST(ProtocolTest, OtherRequestsRoundTrip) {
  Request a;
  a.type = MessageType::kAttach;
  a.id = 7;
  a.pool_id = std::string(64, 'a');
  a.client_pid = 1234;
  auto da = DecodeRequest(EncodeRequest(a));
  ASSERT_TRUE(da.ok()) << da.status();
  EXPECT_EQ(da->pool_id, a.pool_id);
  EXPECT_EQ(da->client_pid, 1234u);

  Request e;
  e.type = MessageType::kEvict;
  e.pool_id = "abc";
  e.force = true;
  auto de = DecodeRequest(EncodeRequest(e));
  ASSERT_TRUE(de.ok());
  EXPECT_TRUE(de->force);

  Request rn;
  rn.type = MessageType::kRenew;
  rn.lease_id = "00ff";
  auto dr = DecodeRequest(EncodeRequest(rn));
  ASSERT_TRUE(dr.ok());
  EXPECT_EQ(dr->type, MessageType::kRenew);
  EXPECT_EQ(dr->lease_id, "00ff");

  Request p;
  p.type = MessageType::kPing;
  p.id = 18446744073709551615ull;
  auto dp = DecodeRequest(EncodeRequest(p));
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->id, 18446744073709551615ull);
}

TEST(ProtocolTest, ReplyRoundTripWithPoolAndCudaHandle) {
  Reply r;
  r.type = MessageType::kAttach;
  r.id = 9;
  PoolInfo info = support::TestPoolInfo(std::string(64, 'f'));
  info.architecture = "qwen2";
  info.tokenizer_family = "bpe/qwen2";
  info.backend = "cuda";
  info.total_bytes = 123456789012ull;
  info.parent = std::string(64, 'c');
  info.parent_tokens = 777;
  r.pool = info;
  r.lease_id = "0123456789abcdef0123456789abcdef";
  r.lease_expires_unix_ms = 1700000030000;
  r.lease_ms = 30000;
  MemoryHandle m;
  m.backend = PoolMemory::kCuda;
  m.size = 4096;
  for (int i = 0; i < 64; ++i) m.cuda.handle[i] = static_cast<uint8_t>(i * 3 + 1);
  for (int i = 0; i < 16; ++i) m.cuda.device_uuid[i] = static_cast<uint8_t>(255 - i);
  m.cuda.offset = 512;
  m.cuda.size = 4096;
  r.memory = m;
  auto d = DecodeReply(EncodeReply(r));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->ok);
  ASSERT_TRUE(d->pool.has_value());
  EXPECT_EQ(d->pool->id, info.id);
  EXPECT_EQ(d->pool->total_bytes, info.total_bytes);
  EXPECT_EQ(d->pool->layers, info.layers);
  EXPECT_EQ(d->pool->architecture, "qwen2");
  EXPECT_EQ(d->pool->tokenizer_family, "bpe/qwen2");
  EXPECT_DOUBLE_EQ(d->pool->effective_ratio, info.effective_ratio);
  EXPECT_EQ(d->pool->created_unix_ms, info.created_unix_ms);
  EXPECT_DOUBLE_EQ(d->pool->publish_ms, info.publish_ms);
  EXPECT_EQ(d->pool->parent, info.parent);
  EXPECT_EQ(d->pool->parent_tokens, 777u);
  EXPECT_EQ(d->lease_id, r.lease_id);
  EXPECT_EQ(d->lease_expires_unix_ms, r.lease_expires_unix_ms);
  EXPECT_EQ(d->lease_ms, 30000);
  ASSERT_TRUE(d->memory.has_value());
  EXPECT_EQ(d->memory->backend, PoolMemory::kCuda);
  EXPECT_EQ(0, std::memcmp(d->memory->cuda.handle, m.cuda.handle, 64));
  EXPECT_EQ(0, std::memcmp(d->memory->cuda.device_uuid, m.cuda.device_uuid, 16));
  EXPECT_EQ(d->memory->cuda.offset, 512u);
}

// Field number `n` of POLYKV_POOL_INFO_FIELDS as a value no other field has (numbers near
// their type's largest, so a narrowing or a lost digit shows).
template <typename T>
void SetDistinct(T* field, int n) {
  if constexpr (std::is_same_v<T, std::string>) {
    *field = "v" + std::to_string(n);
  } else if constexpr (std::is_floating_point_v<T>) {
    *field = n + 0.125;
  } else {
    *field = std::numeric_limits<T>::max() - static_cast<T>(n);
  }
}

// Every field of the list crosses the wire under the name it has always had, and comes back
// exactly, alone (STATS of one pool) and in a list.
TEST(ProtocolTest, EveryPoolInfoFieldRoundTripsUnderItsWireName) {
  PoolInfo info;
  int n = 0;
#define POLYKV_SET(type, name, json_key, c_name) SetDistinct(&info.name, ++n);
  POLYKV_POOL_INFO_FIELDS(POLYKV_SET)
#undef POLYKV_SET
  // The wire names: old and new peers (and pool file manifests) depend on each of them.
  const std::vector<std::string> kWireKeys = absl::StrSplit(
      "id model model_fingerprint architecture tokenizer_family codec backend tokens layers "
      "kv_heads head_dim total_bytes key_codes key_scales value_codes value_norms overhead "
      "bf16_bytes effective_ratio leases created_unix_ms prefill_ms encode_ms publish_ms "
      "fidelity_layers key_rel_mse_mean key_rel_mse_max value_rel_mse_mean value_rel_mse_max "
      "parent parent_tokens origin state state_detail",
      ' ');
  std::vector<std::string> keys;
  ForEachPoolInfoField(info, [&](const char* key, const auto&) { keys.push_back(key); });
  EXPECT_EQ(keys, kWireKeys);

  Reply r;
  r.type = MessageType::kStats;
  r.pool = info;
  r.pools = {PoolInfo(), info};
  const std::string frame = EncodeReply(r);
  for (const std::string& key : kWireKeys) {
    EXPECT_NE(frame.find("\"" + key + "\":"), std::string::npos) << key;
  }
  auto d = DecodeReply(frame);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->pool.has_value());
  ASSERT_EQ(d->pools.size(), 2u);
#define POLYKV_EXPECT_SAME(type, name, json_key, c_name) \
  EXPECT_EQ(d->pool->name, info.name) << json_key;       \
  EXPECT_EQ(d->pools[1].name, info.name) << json_key;    \
  EXPECT_EQ(d->pools[0].name, PoolInfo().name) << json_key;
  POLYKV_POOL_INFO_FIELDS(POLYKV_EXPECT_SAME)
#undef POLYKV_EXPECT_SAME
  EXPECT_EQ(info.key_codes, std::numeric_limits<uint64_t>::max() - 13) << "13th field";

  // A value its field cannot hold is refused, naming the field.
  auto big = DecodeReply(R"({"magic":"PKV1","version":1,"type":"STATS","id":1,"ok":true,)"
                         R"("pool":{"layers":4294967296}})");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.status().message(), "field 'layers' out of range");
  auto text = DecodeReply(R"({"magic":"PKV1","version":1,"type":"STATS","id":1,"ok":true,)"
                          R"("pool":{"effective_ratio":"3"}})");
  EXPECT_EQ(text.status().message(), "field 'effective_ratio' must be a number, got string");
}

TEST(ProtocolTest, ListStatsPingProgressRoundTrip) {
  Reply l;
  l.type = MessageType::kStats;
  l.pools.resize(2);
  l.pools[0].id = "a";
  l.pools[1].id = "b";
  l.memory_used = 100;
  l.memory_cap = 1000;
  auto dl = DecodeReply(EncodeReply(l));
  ASSERT_TRUE(dl.ok());
  ASSERT_EQ(dl->pools.size(), 2u);
  EXPECT_EQ(dl->pools[1].id, "b");
  EXPECT_EQ(dl->memory_used, 100u);
  EXPECT_EQ(dl->memory_cap, 1000u);

  Reply p;
  p.type = MessageType::kPing;
  p.daemon_version = "0.1.0";
  p.daemon_pid = 77;
  auto dp = DecodeReply(EncodeReply(p));
  ASSERT_TRUE(dp.ok());
  EXPECT_EQ(dp->daemon_version, "0.1.0");
  EXPECT_EQ(dp->daemon_pid, 77u);

  Reply g;
  g.type = MessageType::kProgress;
  g.id = 3;
  g.stage = "prefill";
  g.done = 512;
  g.total = 2048;
  auto dg = DecodeReply(EncodeReply(g));
  ASSERT_TRUE(dg.ok());
  EXPECT_EQ(dg->stage, "prefill");
  EXPECT_EQ(dg->done, 512);
  EXPECT_EQ(dg->total, 2048);
}

TEST(ProtocolTest, ErrorReplyCarriesStatus) {
  Reply e = ErrorReply(MessageType::kEvict, 5, absl::FailedPreconditionError("2 live leases"));
  auto d = DecodeReply(EncodeReply(e));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->ok);
  EXPECT_EQ(d->code, "FAILED_PRECONDITION");
  Status s = ReplyStatus(*d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "2 live leases");
  EXPECT_TRUE(ReplyStatus(Reply{}).ok());
}

void ExpectRejected(const std::string& frame, absl::StatusCode code, const std::string& needle) {
  auto r = DecodeRequest(frame);
  ASSERT_FALSE(r.ok()) << frame;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos)
      << r.status() << " should mention " << needle;
}

TEST(ProtocolTest, RejectsMalformedFrames) {
  ExpectRejected("", absl::StatusCode::kInvalidArgument, "JSON");
  ExpectRejected("{\"magic\":\"PKV1\",", absl::StatusCode::kInvalidArgument, "JSON");
  ExpectRejected("[1,2]", absl::StatusCode::kInvalidArgument, "object");
  ExpectRejected(std::string("{\"magic\":\"PKV1\"\0}", 17), absl::StatusCode::kInvalidArgument,
                 "JSON");
  ExpectRejected(R"({"magic":"XXXX","version":1,"type":"PING","id":1})",
                 absl::StatusCode::kInvalidArgument, "magic");
  ExpectRejected(R"({"version":1,"type":"PING"})", absl::StatusCode::kInvalidArgument, "magic");
  ExpectRejected(R"({"magic":"PKV1","version":2,"type":"PING","id":1})",
                 absl::StatusCode::kFailedPrecondition, "version");
  ExpectRejected(R"({"magic":"PKV1","version":"1","type":"PING","id":1})",
                 absl::StatusCode::kInvalidArgument, "version");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"FROB","id":1})",
                 absl::StatusCode::kInvalidArgument, "FROB");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"PROGRESS","id":1})",
                 absl::StatusCode::kInvalidArgument, "not a request");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":7,"id":1})",
                 absl::StatusCode::kInvalidArgument, "type");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"PING","id":"one"})",
                 absl::StatusCode::kInvalidArgument, "'id'");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"ATTACH","id":1,"pool_id":5})",
                 absl::StatusCode::kInvalidArgument, "pool_id");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"ATTACH","id":1})",
                 absl::StatusCode::kInvalidArgument, "pool_id");
  ExpectRejected(
      R"({"magic":"PKV1","version":1,"type":"CREATE_POOL","id":1,"model":"m","token_ids":[1,"x"]})",
      absl::StatusCode::kInvalidArgument, "token_ids[1]");
  ExpectRejected(
      R"({"magic":"PKV1","version":1,"type":"CREATE_POOL","id":1,"model":"m","token_ids":[1,-4]})",
      absl::StatusCode::kInvalidArgument, "token_ids[1]");
  ExpectRejected(R"({"magic":"PKV1","version":1,"type":"CREATE_POOL","id":1,"model":"m"})",
                 absl::StatusCode::kInvalidArgument, "document");
  ExpectRejected(
      R"({"magic":"PKV1","version":1,"type":"EVICT","id":1,"pool_id":"a","force":"yes"})",
      absl::StatusCode::kInvalidArgument, "force");
  ExpectRejected(
      R"({"magic":"PKV1","version":1,"type":"ATTACH","id":1,"pool_id":"a","client_pid":-1})",
      absl::StatusCode::kInvalidArgument, "client_pid");
}

TEST(ProtocolTest, RejectsOversizedFrames) {
  std::string big(kMaxMessageBytes + 1, ' ');
  ExpectRejected(big, absl::StatusCode::kResourceExhausted, "exceeds");
  EXPECT_EQ(DecodeReply(big).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ProtocolTest, ErrorReplyForFrameEchoesTypeAndId) {
  Reply r = ErrorReplyForFrame(R"({"magic":"PKV1","version":9,"type":"LIST","id":77})",
                               absl::FailedPreconditionError("v"));
  EXPECT_EQ(r.type, MessageType::kList);
  EXPECT_EQ(r.id, 77u);
  EXPECT_FALSE(r.ok);
  Reply g = ErrorReplyForFrame("garbage", absl::InvalidArgumentError("x"));
  EXPECT_EQ(g.type, MessageType::kError);
  EXPECT_EQ(g.id, 0u);
  auto d = DecodeReply(EncodeReply(g));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, MessageType::kError);
  EXPECT_EQ(d->code, "INVALID_ARGUMENT");
}

TEST(ProtocolTest, RejectsMalformedReplies) {
  EXPECT_EQ(DecodeReply(R"({"magic":"PKV1","version":1,"type":"PING","id":1})").status().code(),
            absl::StatusCode::kInvalidArgument);  // no "ok"
  EXPECT_EQ(DecodeReply(R"({"magic":"PKV1","version":1,"type":"LIST","id":1,"ok":true,"pools":3})")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeReply(R"({"magic":"PKV1","version":1,"type":"ATTACH","id":1,"ok":true,)"
                        R"("memory":{"backend":"cuda","size":1,"cuda":{"handle":"zz"}}})")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProtocolTest, DefaultEndpointHonoursEnv) {
  setenv("POLYKV_ENDPOINT", "ipc:///tmp/x/y.sock", 1);
  EXPECT_EQ(DefaultEndpoint(), "ipc:///tmp/x/y.sock");
  unsetenv("POLYKV_ENDPOINT");
  std::string e = DefaultEndpoint();
  EXPECT_EQ(e.rfind("ipc://", 0), 0u) << e;
  EXPECT_NE(e.find("control.sock"), std::string::npos) << e;
}

// Issue 16, minor: version 2^64-1 was printed as "-1".
TEST(ProtocolTest, HugeVersionIsPrintedAsSent) {
  auto r = DecodeRequest(R"({"magic":"PKV1","version":18446744073709551615,"type":"PING","id":1})");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(r.status().message()),
            "protocol version 18446744073709551615 is not supported (this side speaks 1)");
  r = DecodeRequest(R"({"magic":"PKV1","version":-3,"type":"PING","id":1})");
  EXPECT_EQ(std::string(r.status().message()),
            "protocol version -3 is not supported (this side speaks 1)");
}

// Issue 16, minor: error replies echoed client input at full size.
TEST(ProtocolTest, ErrorRepliesAreCappedAndEchoesAbbreviated) {
  const std::string huge(10 << 20, 'z');
  Reply r = ErrorReply(MessageType::kAttach, 3, absl::NotFoundError("unknown pool " + huge));
  EXPECT_LE(r.error.size(), kMaxErrorBytes + 32);
  EXPECT_NE(r.error.find("... (10485773 bytes)"), std::string::npos) << r.error.substr(0, 80);
  EXPECT_LT(EncodeReply(r).size(), 2 * kMaxErrorBytes);
  auto bad_type = DecodeRequest(R"({"magic":"PKV1","version":1,"type":")" + huge + R"(","id":1})");
  EXPECT_LT(bad_type.status().message().size(), 200u);
  Reply echoed = ErrorReplyForFrame(huge, bad_type.status());
  EXPECT_LT(EncodeReply(echoed).size(), 2 * kMaxErrorBytes);
  // Abbreviate never splits a UTF-8 sequence.
  EXPECT_EQ(Abbreviate("h\xc3\xa9llo", 2), "h... (6 bytes)");
  EXPECT_EQ(Abbreviate("short", 10), "short");
}

// Issue 16, D4/D5: documents keep every byte and invalid UTF-8 is named, not replaced.
TEST(ProtocolTest, DocumentsKeepNulBytesAndTheirLength) {
  Request req;
  req.type = MessageType::kCreatePool;
  req.model = "m";
  req.document = std::string("A\0B\0", 4);
  const std::string frame = EncodeRequest(req);
  EXPECT_NE(frame.find(R"("document":"A\u0000B\u0000")"), std::string::npos) << frame;
  EXPECT_NE(frame.find(R"("document_bytes":4)"), std::string::npos) << frame;
  auto back = DecodeRequest(frame);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->document, req.document);
  // A frame whose document lost bytes on the way is refused.
  auto cut = DecodeRequest(
      R"({"magic":"PKV1","version":1,"type":"CREATE_POOL","id":1,"model":"m","document":"A","document_bytes":3})");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(cut.status().message()).find("holds 1 bytes but 'document_bytes' says 3"),
            std::string::npos)
      << cut.status();
}

TEST(ProtocolTest, ValidateUtf8NamesTheOffset) {
  EXPECT_TRUE(ValidateUtf8("plain ascii", "x").ok());
  EXPECT_TRUE(ValidateUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "x").ok());
  struct Case {
    std::string text;
    size_t offset;
  } cases[] = {
      {"caf\xe9", 3},             // Latin-1 byte
      {"ab\xc3", 2},              // truncated sequence
      {"\xc0\xaf", 0},            // overlong '/'
      {"x\xed\xa0\x80", 1},       // UTF-16 surrogate
      {"xy\xf4\x90\x80\x80", 2},  // above U+10FFFF
      {"ok\x80", 2},              // lone continuation byte
  };
  for (const auto& c : cases) {
    Status s = ValidateUtf8(c.text, "the document");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find("at byte offset " + std::to_string(c.offset) + " "),
              std::string::npos)
        << s;
  }
  Request req;
  req.pool_id = "\xff";
  EXPECT_EQ(std::string(ValidateRequest(req).message()),
            "the pool id is not valid UTF-8 at byte offset 0 (byte 0xff); send UTF-8 text, or "
            "token ids");
}

TEST(ProtocolTest, InstanceHeartbeatAndDaemonFiguresRoundTrip) {
  Reply p;
  p.type = MessageType::kProgress;
  p.id = 9;
  p.instance = std::string(32, 'e');
  p.stage = "queued";
  p.heartbeat = true;
  auto back = DecodeReply(EncodeReply(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->instance, p.instance);
  EXPECT_TRUE(back->heartbeat);
  Reply ping;
  ping.type = MessageType::kPing;
  ping.instance = "abc";
  ping.model_cache_bytes = 1u << 30;
  ping.model_cache_models = 2;
  ping.model_cache_capacity = 3;
  ping.creates_queued = 4;
  ping.creates_running = 1;
  ping.create_queue_capacity = 8;
  MemoryHandle m;
  m.backend = PoolMemory::kHost;
  m.transport = "memfd";
  m.fd_socket = "/run/polykv/control.sock.fds";
  m.size = 123;
  ping.memory = m;
  back = DecodeReply(EncodeReply(ping));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model_cache_bytes, 1u << 30);
  EXPECT_EQ(back->model_cache_models, 2u);
  EXPECT_EQ(back->model_cache_capacity, 3u);
  EXPECT_EQ(back->creates_queued, 4u);
  EXPECT_EQ(back->creates_running, 1u);
  EXPECT_EQ(back->create_queue_capacity, 8u);
  ASSERT_TRUE(back->memory.has_value());
  EXPECT_EQ(back->memory->transport, "memfd");
  EXPECT_EQ(back->memory->fd_socket, m.fd_socket);
  EXPECT_EQ(DecodeReply(R"({"magic":"PKV1","version":1,"type":"ATTACH","id":1,"ok":true,)"
                        R"("memory":{"backend":"host","transport":"pigeon","size":1}})")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
TEST(ProtocolTest, PeerMessagesRoundTrip) {
  // FETCH and PEER_FETCH need a pool id; PEER_RELEASE a transfer id.
  Request fetch;
  fetch.type = MessageType::kFetch;
  fetch.id = 3;
  fetch.pool_id = "abcdef0123";
  fetch.progress = true;
  auto req = DecodeRequest(EncodeRequest(fetch));
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->type, MessageType::kFetch);
  EXPECT_EQ(req->pool_id, "abcdef0123");
  EXPECT_TRUE(req->progress);
  for (const char* type : {"FETCH", "PEER_FETCH"}) {
    auto bad = DecodeRequest(
        absl::StrCat(R"({"magic":"PKV1","version":1,"type":")", type, R"(","id":1})"));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_NE(std::string(bad.status().message()).find("pool_id"), std::string::npos);
  }
  Request release;
  release.type = MessageType::kPeerRelease;
  release.transfer_id = "0123456789abcdef";
  req = DecodeRequest(EncodeRequest(release));
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->transfer_id, release.transfer_id);
  release.transfer_id.clear();
  EXPECT_EQ(DecodeRequest(EncodeRequest(release)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A PEER_FETCH reply carries the UCX descriptor as bytes (base64 on the wire).
  Reply offer;
  offer.type = MessageType::kPeerFetch;
  offer.id = 5;
  offer.transfer_id = "feed";
  offer.pool_bytes = 188772352;
  for (int i = 0; i < 300; ++i) offer.descriptor.push_back(static_cast<char>(i * 7));
  PoolInfo info;
  info.id = std::string(64, 'c');
  info.origin = "peer tcp://10.0.0.1:7400";
  offer.pool = info;
  auto back = DecodeReply(EncodeReply(offer));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->descriptor, offer.descriptor);
  EXPECT_EQ(back->transfer_id, "feed");
  EXPECT_EQ(back->pool_bytes, 188772352u);
  ASSERT_TRUE(back->pool.has_value());
  EXPECT_EQ(back->pool->origin, info.origin);
  EXPECT_EQ(DecodeReply(R"({"magic":"PKV1","version":1,"type":"PEER_FETCH","id":1,"ok":true,)"
                        R"("descriptor":"!!not base64!!"})")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // FETCH replies say whether the pool was pulled now; PING replies list the peers.
  Reply fetched;
  fetched.type = MessageType::kFetch;
  fetched.created = true;
  back = DecodeReply(EncodeReply(fetched));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->created);
  Reply ping;
  ping.type = MessageType::kPing;
  PeerState up;
  up.endpoint = "tcp://10.0.0.1:7400";
  up.state = "up";
  up.instance = std::string(32, 'a');
  up.version = "0.1.0";
  up.pools = 3;
  up.rtt_ms = 0.25;
  up.last_seen_unix_ms = 1700000000000;
  PeerState refused;
  refused.endpoint = "tcp://10.0.0.2:7400";
  refused.state = "refused";
  refused.detail = "refused this daemon's CURVE key";
  ping.peers = {up, refused};
  back = DecodeReply(EncodeReply(ping));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->peers.size(), 2u);
  EXPECT_EQ(back->peers[0].endpoint, up.endpoint);
  EXPECT_EQ(back->peers[0].state, "up");
  EXPECT_EQ(back->peers[0].pools, 3u);
  EXPECT_EQ(back->peers[0].rtt_ms, 0.25);
  EXPECT_EQ(back->peers[0].last_seen_unix_ms, 1700000000000);
  EXPECT_EQ(back->peers[1].detail, refused.detail);
}

TEST(ProtocolTest, MessageTableHasOneRowPerType) {
  for (int i = 0; i <= static_cast<int>(MessageType::kPeerRelease); ++i) {
    const auto t = static_cast<MessageType>(i);
    const MessageSpec& spec = SpecOf(t);
    EXPECT_EQ(spec.type, t) << i;
    auto parsed = ParseMessageType(MessageTypeName(t));
    ASSERT_TRUE(parsed.ok()) << i;
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(SpecOf(MessageType::kCreatePool).role, MessageRole::kOperator);
  EXPECT_EQ(SpecOf(MessageType::kEvict).role, MessageRole::kOperator);
  EXPECT_EQ(SpecOf(MessageType::kFetch).role, MessageRole::kOperator);
  EXPECT_EQ(SpecOf(MessageType::kAttach).role, MessageRole::kReader);
  EXPECT_EQ(SpecOf(MessageType::kPeerFetch).role, MessageRole::kPeer);
  EXPECT_EQ(SpecOf(MessageType::kProgress).role, MessageRole::kNone);
  EXPECT_EQ(SpecOf(MessageType::kCreatePool).runs, MessageRuns::kWorker);
  EXPECT_EQ(SpecOf(MessageType::kAttach).runs, MessageRuns::kInlineOrWorker);
  EXPECT_TRUE(SpecOf(MessageType::kPing).peer_channel);
  EXPECT_FALSE(SpecOf(MessageType::kCreatePool).peer_channel);
  // Required fields come from the table: RENEW without a lease id, CREATE_POOL without a model.
  EXPECT_NE(
      std::string(
          DecodeRequest(R"({"magic":"PKV1","version":1,"type":"RENEW","id":1})").status().message())
          .find("lease_id"),
      std::string::npos);
  EXPECT_NE(std::string(DecodeRequest(R"({"magic":"PKV1","version":1,"type":"CREATE_POOL","id":1,)"
                                      R"("token_ids":[1]})")
                            .status()
                            .message())
                .find("'model' is required"),
            std::string::npos);
}

}  // namespace polykv::ipc
