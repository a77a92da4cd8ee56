// The polykvd control protocol: JSON encoding, decoding and validation (nlohmann-json).
#include "polykv/ipc/protocol.h"

#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "protocol_json.h"

namespace polykv::ipc {
namespace {

using json = nlohmann::json;

using R = MessageRole;
using Runs = MessageRuns;
// The protocol's vocabulary, written once.
constexpr MessageSpec kSpecs[] = {
    // type                     name            required fields                    role
    {MessageType::kCreatePool, "CREATE_POOL", kNeedsModelOrParent | kNeedsDocument, R::kOperator,
     Runs::kWorker, false},
    {MessageType::kAttach, "ATTACH", kNeedsPoolId, R::kReader, Runs::kInlineOrWorker, false},
    {MessageType::kRenew, "RENEW", kNeedsLeaseId, R::kReader, Runs::kInline, false},
    {MessageType::kDetach, "DETACH", kNeedsLeaseId, R::kReader, Runs::kInline, false},
    {MessageType::kList, "LIST", 0, R::kReader, Runs::kInline, true},
    {MessageType::kStats, "STATS", 0, R::kReader, Runs::kInline, false},
    {MessageType::kEvict, "EVICT", kNeedsPoolId, R::kOperator, Runs::kInline, false},
    {MessageType::kPing, "PING", 0, R::kReader, Runs::kInline, true},
    {MessageType::kProgress, "PROGRESS", 0, R::kNone, Runs::kInline, false},
    {MessageType::kError, "ERROR", 0, R::kNone, Runs::kInline, false},
    {MessageType::kFetch, "FETCH", kNeedsPoolId, R::kOperator, Runs::kWorker, false},
    {MessageType::kPeerFetch, "PEER_FETCH", kNeedsPoolId, R::kPeer, Runs::kInline, true},
    {MessageType::kPeerRelease, "PEER_RELEASE", kNeedsTransferId, R::kPeer, Runs::kInline, true},
};
constexpr bool SpecsInEnumOrder() {
  for (size_t i = 0; i < sizeof(kSpecs) / sizeof(kSpecs[0]); ++i) {
    if (static_cast<size_t>(kSpecs[i].type) != i) return false;
  }
  return true;
}
static_assert(SpecsInEnumOrder(), "kSpecs: one row per MessageType, in enum order");

std::string Hex(const uint8_t* data, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(data), n));
}

Status Unhex(const std::string& hex, uint8_t* out, size_t n, const std::string& field) {
  if (hex.size() != 2 * n) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", field, "' must be ", 2 * n, " hex chars, got ", hex.size()));
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("field '", field, "' is not hex"));
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return absl::OkStatus();
}

// ---- typed field readers: absent -> keep default; present with the wrong type -> error ----

Status WrongType(const std::string& field, const std::string& want, const json& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("field '", field, "' must be ", want, ", got ", v.type_name()));
}

Status Get(const json& j, const char* field, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return WrongType(field, "a string", *it);
  *out = it->get<std::string>();
  return absl::OkStatus();
}

Status Get(const json& j, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return WrongType(field, "a boolean", *it);
  *out = it->get<bool>();
  return absl::OkStatus();
}

Status Get(const json& j, const char* field, double* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return WrongType(field, "a number", *it);
  *out = it->get<double>();
  return absl::OkStatus();
}

template <typename T>
Status GetInt(const json& j, const char* field, T* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("field '", field, "' out of range"));
    }
    *out = static_cast<T>(v);
    return absl::OkStatus();
  }
  if (it->is_number_integer()) {
    int64_t v = it->get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 &&
         static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return absl::InvalidArgumentError(absl::StrCat("field '", field, "' out of range"));
    }
    *out = static_cast<T>(v);
    return absl::OkStatus();
  }
  return WrongType(field, "an integer", *it);
}

// ---- PoolInfo / MemoryHandle ----

// A field of any type of the list: integers are range-checked (GetInt).
template <typename T>
Status GetField(const json& j, const char* field, T* out) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return GetInt(j, field, out);
  } else {
    return Get(j, field, out);
  }
}

// The visitors of the field lists (protocol.h), as objects that can be passed on.
constexpr auto kPoolInfoFields = [](auto& object, auto&& f) { ForEachPoolInfoField(object, f); };
constexpr auto kPeerFields = [](auto& object, auto&& f) { ForEachPeerStateField(object, f); };
constexpr auto kDaemonFigures = [](auto& object, auto&& f) { ForEachDaemonFigure(object, f); };

// Writes every field `fields` lists of `object` into *j under its key.
template <typename T, typename Fields>
void WriteFields(const T& object, const Fields& fields, json* j) {
  fields(object, [&](const char* key, const auto& value) { (*j)[key] = value; });
}

// Reads every field `fields` lists of *object from `j` (GetField: absent fields keep their
// value, a wrong type is kInvalidArgument naming the first such field).
template <typename T, typename Fields>
Status ReadFields(const json& j, const Fields& fields, T* object) {
  Status status;
  fields(*object, [&](const char* key, auto& value) {
    if (status.ok()) status = GetField(j, key, &value);
  });
  return status;
}

// A struct of a field list as its own JSON object.
template <typename T, typename Fields>
json ObjectToJson(const T& object, const Fields& fields) {
  json j = json::object();
  WriteFields(object, fields, &j);
  return j;
}

// The struct a JSON object holds; kInvalidArgument when `j` is not an object (`where` names
// it) or a field has the wrong type.
template <typename T, typename Fields>
StatusOr<T> ObjectFromJson(const json& j, const Fields& fields, const std::string& where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", where, "' must be an object"));
  }
  T object;
  POLYKV_RETURN_IF_ERROR(ReadFields(j, fields, &object));
  return object;
}

json PoolInfoToJson(const PoolInfo& p) { return ObjectToJson(p, kPoolInfoFields); }

StatusOr<PoolInfo> PoolInfoFromJson(const json& j, const std::string& where) {
  return ObjectFromJson<PoolInfo>(j, kPoolInfoFields, where);
}

json MemoryToJson(const MemoryHandle& m) {
  json j{{"backend", std::string(PoolMemoryName(m.backend))},
         {"shm_name", m.shm_name},
         {"size", m.size}};
  if (!m.transport.empty()) j["transport"] = m.transport;
  if (!m.fd_socket.empty()) j["fd_socket"] = m.fd_socket;
  if (m.backend == PoolMemory::kCuda) {
    j["cuda"] = json{{"version", m.cuda.version},
                     {"handle", Hex(m.cuda.handle, sizeof(m.cuda.handle))},
                     {"offset", m.cuda.offset},
                     {"size", m.cuda.size},
                     {"device_uuid", Hex(m.cuda.device_uuid, sizeof(m.cuda.device_uuid))}};
  }
  return j;
}

StatusOr<MemoryHandle> MemoryFromJson(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("field 'memory' must be an object");
  MemoryHandle m;
  std::string backend;
  POLYKV_RETURN_IF_ERROR(Get(j, "backend", &backend));
  POLYKV_RETURN_IF_ERROR(Get(j, "shm_name", &m.shm_name));
  POLYKV_RETURN_IF_ERROR(Get(j, "transport", &m.transport));
  POLYKV_RETURN_IF_ERROR(Get(j, "fd_socket", &m.fd_socket));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "size", &m.size));
  if (std::optional<PoolMemory> memory = ParsePoolMemory(backend)) {
    m.backend = *memory;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'memory.backend' must be \"host\" or \"cuda\", got \"",
                     Abbreviate(backend, 64), "\""));
  }
  if (!m.transport.empty() && m.transport != "memfd" && m.transport != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'memory.transport' must be \"memfd\" or \"shm\", got \"",
                     Abbreviate(m.transport, 64), "\""));
  }
  if (auto it = j.find("cuda"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("memory.cuda", "an object", *it);
    std::string handle, uuid;
    POLYKV_RETURN_IF_ERROR(GetInt(*it, "version", &m.cuda.version));
    POLYKV_RETURN_IF_ERROR(Get(*it, "handle", &handle));
    POLYKV_RETURN_IF_ERROR(GetInt(*it, "offset", &m.cuda.offset));
    POLYKV_RETURN_IF_ERROR(GetInt(*it, "size", &m.cuda.size));
    POLYKV_RETURN_IF_ERROR(Get(*it, "device_uuid", &uuid));
    POLYKV_RETURN_IF_ERROR(
        Unhex(handle, m.cuda.handle, sizeof(m.cuda.handle), "memory.cuda.handle"));
    POLYKV_RETURN_IF_ERROR(
        Unhex(uuid, m.cuda.device_uuid, sizeof(m.cuda.device_uuid), "memory.cuda.device_uuid"));
  } else if (m.backend == PoolMemory::kCuda) {
    return absl::InvalidArgumentError("field 'memory.cuda' is required for backend \"cuda\"");
  }
  return m;
}

// ---- common envelope ----

struct Envelope {
  MessageType type = MessageType::kPing;
  uint64_t id = 0;
};

StatusOr<json> ParseFrame(std::string_view frame) {
  if (frame.size() > kMaxMessageBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "message of ", frame.size(), " bytes exceeds the limit of ", kMaxMessageBytes, " bytes"));
  }
  json j = json::parse(frame.begin(), frame.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("message is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("message must be a JSON object");
  return j;
}

StatusOr<Envelope> ParseEnvelope(const json& j) {
  std::string magic;
  POLYKV_RETURN_IF_ERROR(Get(j, "magic", &magic));
  if (magic != kProtocolMagic) {
    return absl::InvalidArgumentError(absl::StrCat("field 'magic' must be \"", kProtocolMagic,
                                                   "\", got \"", Abbreviate(magic, 64), "\""));
  }
  auto v = j.find("version");
  if (v == j.end()) return absl::InvalidArgumentError("field 'version' is missing");
  if (!v->is_number_integer()) return WrongType("version", "an integer", *v);
  // Unsigned JSON integers above INT64_MAX must not read as negative numbers.
  const bool matches = v->is_number_unsigned()
                           ? v->get<uint64_t>() == static_cast<uint64_t>(kProtocolVersion)
                           : v->get<int64_t>() == kProtocolVersion;
  if (!matches) {
    return absl::FailedPreconditionError(absl::StrCat("protocol version ", v->dump(),
                                                      " is not supported (this side speaks ",
                                                      kProtocolVersion, ")"));
  }
  auto t = j.find("type");
  if (t == j.end()) return absl::InvalidArgumentError("field 'type' is missing");
  if (!t->is_string()) return WrongType("type", "a string", *t);
  Envelope e;
  POLYKV_ASSIGN_OR_RETURN(e.type, ParseMessageType(t->get<std::string>()));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "id", &e.id));
  return e;
}

json EnvelopeJson(MessageType type, uint64_t id) {
  return json{{"magic", kProtocolMagic},
              {"version", kProtocolVersion},
              {"type", std::string(MessageTypeName(type))},
              {"id", id}};
}

std::string Dump(const json& j) {
  // Replace invalid UTF-8 (e.g. a document with stray bytes) instead of throwing.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  for (const auto& t : kSpecs) {
    if (t.type == type) return t.name;
  }
  return "UNKNOWN";
}

const MessageSpec& SpecOf(MessageType type) {
  const size_t i = static_cast<size_t>(type);
  return i < sizeof(kSpecs) / sizeof(kSpecs[0]) ? kSpecs[i]
                                                : kSpecs[static_cast<size_t>(MessageType::kError)];
}

StatusOr<MessageType> ParseMessageType(std::string_view name) {
  for (const auto& t : kSpecs) {
    if (t.name == name) return t.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown message type \"",
                   Abbreviate(absl::string_view(name.data(), name.size()), 64), "\""));
}

std::string EncodeRequest(const Request& r) {
  json j = EnvelopeJson(r.type, r.id);
  switch (r.type) {
    case MessageType::kCreatePool:
      j["model"] = r.model;
      j["document"] = r.document;
      j["document_bytes"] = r.document.size();
      j["token_ids"] = r.token_ids;
      j["add_bos"] = r.add_bos;
      j["codec"] = r.codec;
      j["key_scale"] = r.key_scale;
      j["norm_correction"] = r.norm_correction;
      j["progress"] = r.progress;
      if (!r.parent.empty()) j["parent"] = r.parent;
      break;
    case MessageType::kAttach:
      j["pool_id"] = r.pool_id;
      j["client_pid"] = r.client_pid;
      // Heartbeats while the daemon replicates the pool first (only sent when asked, so the
      // frame of a plain ATTACH is what it always was).
      if (r.progress) j["progress"] = true;
      break;
    case MessageType::kEvict:
      j["pool_id"] = r.pool_id;
      j["force"] = r.force;
      break;
    case MessageType::kFetch:
      j["pool_id"] = r.pool_id;
      j["progress"] = r.progress;
      break;
    case MessageType::kPeerFetch:
      j["pool_id"] = r.pool_id;
      break;
    case MessageType::kPeerRelease:
      j["transfer_id"] = r.transfer_id;
      break;
    case MessageType::kStats:
      if (!r.pool_id.empty()) j["pool_id"] = r.pool_id;
      break;
    case MessageType::kRenew:
    case MessageType::kDetach:
      j["lease_id"] = r.lease_id;
      break;
    default:
      break;
  }
  return Dump(j);
}

StatusOr<Request> DecodeRequest(std::string_view frame) {
  POLYKV_ASSIGN_OR_RETURN(json j, ParseFrame(frame));
  POLYKV_ASSIGN_OR_RETURN(Envelope e, ParseEnvelope(j));
  if (SpecOf(e.type).role == MessageRole::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message type \"", std::string(MessageTypeName(e.type)), "\" is not a request"));
  }
  Request r;
  r.type = e.type;
  r.id = e.id;
  POLYKV_RETURN_IF_ERROR(Get(j, "model", &r.model));
  POLYKV_RETURN_IF_ERROR(Get(j, "document", &r.document));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "document_bytes", &r.document_bytes));
  if (r.document_bytes != 0 && r.document_bytes != r.document.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'document' holds ", r.document.size(), " bytes but 'document_bytes' says ",
        r.document_bytes, " (the document was altered on the way)"));
  }
  if (auto it = j.find("token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("token_ids", "an array of integers", *it);
    r.token_ids.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("field 'token_ids[", i, "]' must be an integer, got ", v.type_name()));
      }
      int64_t id = v.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat("field 'token_ids[", i, "]' = ", id, " is out of range"));
      }
      r.token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  POLYKV_RETURN_IF_ERROR(Get(j, "add_bos", &r.add_bos));
  POLYKV_RETURN_IF_ERROR(Get(j, "codec", &r.codec));
  POLYKV_RETURN_IF_ERROR(Get(j, "key_scale", &r.key_scale));
  POLYKV_RETURN_IF_ERROR(Get(j, "norm_correction", &r.norm_correction));
  POLYKV_RETURN_IF_ERROR(Get(j, "progress", &r.progress));
  POLYKV_RETURN_IF_ERROR(Get(j, "parent", &r.parent));
  POLYKV_RETURN_IF_ERROR(Get(j, "pool_id", &r.pool_id));
  POLYKV_RETURN_IF_ERROR(Get(j, "force", &r.force));
  POLYKV_RETURN_IF_ERROR(Get(j, "lease_id", &r.lease_id));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "client_pid", &r.client_pid));
  POLYKV_RETURN_IF_ERROR(Get(j, "transfer_id", &r.transfer_id));
  // Per-type required fields (kSpecs).
  const uint32_t need = SpecOf(r.type).required;
  if ((need & kNeedsModelOrParent) && r.model.empty() && r.parent.empty()) {
    return absl::InvalidArgumentError("field 'model' is required (or 'parent')");
  }
  if ((need & kNeedsDocument) && r.document.empty() && r.token_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(MessageTypeName(r.type)),
                                                   " needs a non-empty 'document' or 'token_ids'"));
  }
  if ((need & kNeedsPoolId) && r.pool_id.empty()) {
    return absl::InvalidArgumentError("field 'pool_id' is required");
  }
  if ((need & kNeedsLeaseId) && r.lease_id.empty()) {
    return absl::InvalidArgumentError("field 'lease_id' is required");
  }
  if ((need & kNeedsTransferId) && r.transfer_id.empty()) {
    return absl::InvalidArgumentError("field 'transfer_id' is required");
  }
  return r;
}

std::string EncodeReply(const Reply& r) {
  json j = EnvelopeJson(r.type, r.id);
  if (!r.instance.empty()) j["instance"] = r.instance;
  if (r.type == MessageType::kProgress) {
    j["stage"] = r.stage;
    j["done"] = r.done;
    j["total"] = r.total;
    if (r.heartbeat) j["heartbeat"] = true;
    return Dump(j);
  }
  j["ok"] = r.ok;
  if (!r.ok) {
    j["code"] = r.code;
    j["error"] = Abbreviate(r.error, kMaxErrorBytes);
    return Dump(j);
  }
  if (r.pool) j["pool"] = PoolInfoToJson(*r.pool);
  if (r.type == MessageType::kCreatePool || r.type == MessageType::kFetch) {
    j["created"] = r.created;
  }
  if (r.type == MessageType::kList || r.type == MessageType::kStats) {
    json arr = json::array();
    for (const auto& p : r.pools) arr.push_back(PoolInfoToJson(p));
    j["pools"] = std::move(arr);
  }
  if (!r.lease_id.empty()) {
    j["lease_id"] = r.lease_id;
    j["lease_expires_unix_ms"] = r.lease_expires_unix_ms;
    j["lease_ms"] = r.lease_ms;
  }
  if (r.memory) j["memory"] = MemoryToJson(*r.memory);
  if (!r.daemon_version.empty()) j["daemon_version"] = r.daemon_version;
  if (r.daemon_pid != 0) j["daemon_pid"] = r.daemon_pid;
  if (r.type == MessageType::kStats || r.type == MessageType::kPing ||
      r.type == MessageType::kList) {
    WriteFields(r, kDaemonFigures, &j);
  }
  if (r.type == MessageType::kPing && !r.peers.empty()) {
    json arr = json::array();
    for (const auto& p : r.peers) arr.push_back(ObjectToJson(p, kPeerFields));
    j["peers"] = std::move(arr);
  }
  if (r.type == MessageType::kPeerFetch) {
    j["transfer_id"] = r.transfer_id;
    j["descriptor"] = absl::Base64Escape(r.descriptor);
    j["pool_bytes"] = r.pool_bytes;
  }
  return Dump(j);
}

StatusOr<Reply> DecodeReply(std::string_view frame) {
  POLYKV_ASSIGN_OR_RETURN(json j, ParseFrame(frame));
  POLYKV_ASSIGN_OR_RETURN(Envelope e, ParseEnvelope(j));
  Reply r;
  r.type = e.type;
  r.id = e.id;
  POLYKV_RETURN_IF_ERROR(Get(j, "instance", &r.instance));
  if (r.type == MessageType::kProgress) {
    POLYKV_RETURN_IF_ERROR(Get(j, "stage", &r.stage));
    POLYKV_RETURN_IF_ERROR(GetInt(j, "done", &r.done));
    POLYKV_RETURN_IF_ERROR(GetInt(j, "total", &r.total));
    POLYKV_RETURN_IF_ERROR(Get(j, "heartbeat", &r.heartbeat));
    return r;
  }
  auto ok = j.find("ok");
  if (ok == j.end()) return absl::InvalidArgumentError("field 'ok' is missing");
  if (!ok->is_boolean()) return WrongType("ok", "a boolean", *ok);
  r.ok = ok->get<bool>();
  POLYKV_RETURN_IF_ERROR(Get(j, "code", &r.code));
  POLYKV_RETURN_IF_ERROR(Get(j, "error", &r.error));
  if (!r.ok) {
    if (r.code.empty()) r.code = "UNKNOWN";
    return r;
  }
  if (auto it = j.find("pool"); it != j.end() && !it->is_null()) {
    POLYKV_ASSIGN_OR_RETURN(r.pool, PoolInfoFromJson(*it, "pool"));
  }
  POLYKV_RETURN_IF_ERROR(Get(j, "created", &r.created));
  // Only LIST and STATS replies carry pools (as EncodeReply writes them): a "pools" field in
  // any other reply is ignored, so decode(encode(r)) == r (found by fuzz_protocol).
  if (auto it = j.find("pools"); it != j.end() && !it->is_null() &&
                                 (r.type == MessageType::kList || r.type == MessageType::kStats)) {
    if (!it->is_array()) return WrongType("pools", "an array", *it);
    for (const auto& p : *it) {
      POLYKV_ASSIGN_OR_RETURN(PoolInfo info, PoolInfoFromJson(p, "pools[]"));
      r.pools.push_back(std::move(info));
    }
  }
  POLYKV_RETURN_IF_ERROR(Get(j, "lease_id", &r.lease_id));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "lease_expires_unix_ms", &r.lease_expires_unix_ms));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "lease_ms", &r.lease_ms));
  if (auto it = j.find("memory"); it != j.end() && !it->is_null()) {
    POLYKV_ASSIGN_OR_RETURN(r.memory, MemoryFromJson(*it));
  }
  POLYKV_RETURN_IF_ERROR(Get(j, "daemon_version", &r.daemon_version));
  POLYKV_RETURN_IF_ERROR(GetInt(j, "daemon_pid", &r.daemon_pid));
  POLYKV_RETURN_IF_ERROR(ReadFields(j, kDaemonFigures, &r));
  if (auto it = j.find("peers"); it != j.end() && !it->is_null() && r.type == MessageType::kPing) {
    if (!it->is_array()) return WrongType("peers", "an array", *it);
    for (const auto& p : *it) {
      POLYKV_ASSIGN_OR_RETURN(PeerState peer, ObjectFromJson<PeerState>(p, kPeerFields, "peers[]"));
      r.peers.push_back(std::move(peer));
    }
  }
  if (r.type == MessageType::kPeerFetch) {
    std::string descriptor64;
    POLYKV_RETURN_IF_ERROR(Get(j, "transfer_id", &r.transfer_id));
    POLYKV_RETURN_IF_ERROR(Get(j, "descriptor", &descriptor64));
    POLYKV_RETURN_IF_ERROR(GetInt(j, "pool_bytes", &r.pool_bytes));
    if (!absl::Base64Unescape(descriptor64, &r.descriptor)) {
      return absl::InvalidArgumentError("field 'descriptor' is not base64");
    }
  }
  return r;
}

Reply ErrorReply(MessageType type, uint64_t request_id, const Status& status) {
  Reply r;
  r.type = type;
  r.id = request_id;
  r.ok = false;
  r.code = absl::StatusCodeToString(status.code());
  r.error = Abbreviate(status.message(), kMaxErrorBytes);
  return r;
}

Reply ErrorReplyForFrame(std::string_view frame, const Status& status) {
  MessageType type = MessageType::kError;
  uint64_t id = 0;
  if (frame.size() <= kMaxMessageBytes) {
    json j = json::parse(frame.begin(), frame.end(), nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      if (auto t = j.find("type"); t != j.end() && t->is_string()) {
        auto parsed = ParseMessageType(t->get<std::string>());
        if (parsed.ok() && *parsed != MessageType::kProgress) type = *parsed;
      }
      if (auto i = j.find("id"); i != j.end() && i->is_number_unsigned()) id = i->get<uint64_t>();
    }
  }
  return ErrorReply(type, id, status);
}

Status ReplyStatus(const Reply& reply) {
  if (reply.ok || reply.type == MessageType::kProgress) return absl::OkStatus();
  static const struct {
    const char* name;
    absl::StatusCode code;
  } kCodes[] = {
      {"CANCELLED", absl::StatusCode::kCancelled},
      {"UNKNOWN", absl::StatusCode::kUnknown},
      {"INVALID_ARGUMENT", absl::StatusCode::kInvalidArgument},
      {"DEADLINE_EXCEEDED", absl::StatusCode::kDeadlineExceeded},
      {"NOT_FOUND", absl::StatusCode::kNotFound},
      {"ALREADY_EXISTS", absl::StatusCode::kAlreadyExists},
      {"PERMISSION_DENIED", absl::StatusCode::kPermissionDenied},
      {"RESOURCE_EXHAUSTED", absl::StatusCode::kResourceExhausted},
      {"FAILED_PRECONDITION", absl::StatusCode::kFailedPrecondition},
      {"ABORTED", absl::StatusCode::kAborted},
      {"OUT_OF_RANGE", absl::StatusCode::kOutOfRange},
      {"UNIMPLEMENTED", absl::StatusCode::kUnimplemented},
      {"INTERNAL", absl::StatusCode::kInternal},
      {"UNAVAILABLE", absl::StatusCode::kUnavailable},
      {"DATA_LOSS", absl::StatusCode::kDataLoss},
      {"UNAUTHENTICATED", absl::StatusCode::kUnauthenticated},
  };
  absl::StatusCode code = absl::StatusCode::kUnknown;
  for (const auto& c : kCodes) {
    if (reply.code == c.name) code = c.code;
  }
  return Status(code, reply.error.empty() ? "error reply without a message" : reply.error);
}

Status ValidateUtf8(absl::string_view text, absl::string_view field) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      len = 0;
      cp = 0;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (s[i + k] & 0x3F);
      }
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF are invalid too.
    if (ok) {
      static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), " is not valid UTF-8 at byte offset ", i, " (byte 0x",
                       absl::Hex(c, absl::kZeroPad2), "); send UTF-8 text, or token ids"));
    }
    i += len;
  }
  return absl::OkStatus();
}

Status ValidateRequest(const Request& r) {
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.document, "the document"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.model, "the model path"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.pool_id, "the pool id"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.lease_id, "the lease id"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.codec, "the codec"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.key_scale, "the key scale"));
  POLYKV_RETURN_IF_ERROR(ValidateUtf8(r.parent, "the parent pool id"));
  return absl::OkStatus();
}

std::string Abbreviate(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Do not split a UTF-8 sequence: back up over continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), "... (", text.size(), " bytes)");
}

std::string DefaultEndpoint() {
  if (const char* env = std::getenv("POLYKV_ENDPOINT"); env != nullptr && *env != '\0') {
    return env;
  }
  if (access("/run/polykv", W_OK) == 0) return "ipc:///run/polykv/control.sock";
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat("ipc://", xdg, "/polykv/control.sock");
  }
  return absl::StrCat("ipc:///tmp/polykv-", getuid(), "/control.sock");
}

namespace internal {

nlohmann::json PoolInfoJson(const PoolInfo& p) { return PoolInfoToJson(p); }

StatusOr<PoolInfo> PoolInfoFromJsonObject(const nlohmann::json& j, const std::string& where) {
  return PoolInfoFromJson(j, where);
}

}  // namespace internal
}  // namespace polykv::ipc
