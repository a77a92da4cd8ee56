// CURVE key files of polykvd's peer channel (libzmq's Z85 and CURVE helpers).
#include "polykv/ipc/curve_keys.h"

#include <sys/stat.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "polykv/ipc/protocol.h"

namespace polykv::ipc {
namespace {

bool IsZ85Key(const std::string& key) {
  if (key.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, key.c_str()) != nullptr;
}

StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, " ", path, " cannot be read: ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is over 1 MiB"));
  }
  return ss.str();
}

}  // namespace

StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_keypair: ", zmq_strerror(zmq_errno()),
                                            " (is libzmq built with CURVE?)"));
  }
  return CurveKeyPair{pub, sec};
}

std::string CurveKeyPairFileText(const CurveKeyPair& keys) {
  return absl::StrCat("# polykvd CURVE key pair (Z85). Keep this file private (mode 0600);\n",
                      "# list the public key in the peer-keys file of the daemons it talks to.\n",
                      "public = ", keys.public_key, "\n", "secret = ", keys.secret_key, "\n");
}

StatusOr<CurveKeyPair> ReadCurveKeyPairFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("CURVE key file ", path, " cannot be read: ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "CURVE key file %s has mode %04o: group or others may read its secret key (chmod 600)",
        path, st.st_mode & 07777));
  }
  POLYKV_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "CURVE key file"));
  CurveKeyPair keys;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("CURVE key file ", path, " line ", line_no, ": expected 'name = key'"));
    }
    const std::string name(absl::StripAsciiWhitespace(kv[0]));
    std::string value(absl::StripAsciiWhitespace(kv[1]));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (!IsZ85Key(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CURVE key file ", path, " line ", line_no, ": not a 40-character Z85 key"));
    }
    if (name == "public") {
      keys.public_key = value;
    } else if (name == "secret") {
      keys.secret_key = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("CURVE key file ", path, " line ", line_no, ": unknown name '", name, "'"));
    }
  }
  if (keys.public_key.empty() || keys.secret_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE key file ", path, " needs both 'public' and 'secret'"));
  }
  char derived[41];
  if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0 || keys.public_key != derived) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE key file ", path, ": the public key is not the secret key's"));
  }
  return keys;
}

Status CheckTcpEndpoint(const std::string& endpoint, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " \"", Abbreviate(endpoint, 128),
                                                   "\": ", why, " (expected tcp://HOST:PORT)"));
  };
  absl::string_view rest = endpoint;
  if (!absl::ConsumePrefix(&rest, "tcp://")) return bad("not a tcp:// endpoint");
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("no host or port");
  uint32_t port = 0;
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return bad("port must be 1..65535");
  }
  return absl::OkStatus();
}

StatusOr<PeerKeys> ReadPeerKeysFile(const std::string& path) {
  POLYKV_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, "peer-keys file"));
  PeerKeys keys;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    // '#' starts a comment at the start of a line or after a blank ('#' is a Z85 digit).
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line = line.substr(0, i);
        break;
      }
    }
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f.empty()) continue;
    const std::string where = absl::StrCat("peer-keys file ", path, " line ", line_no);
    if (f.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected '<public key> [tcp://HOST:PORT]'"));
    }
    if (!IsZ85Key(f[0])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a 40-character Z85 key"));
    }
    keys.trusted.insert(f[0]);
    if (f.size() == 2) {
      POLYKV_RETURN_IF_ERROR(CheckTcpEndpoint(f[1], where));
      auto [it, inserted] = keys.by_endpoint.emplace(f[1], f[0]);
      if (!inserted && it->second != f[0]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", f[1], " is listed with two different keys"));
      }
    }
  }
  return keys;
}

}  // namespace polykv::ipc
