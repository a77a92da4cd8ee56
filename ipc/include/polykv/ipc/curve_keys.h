// CURVE keys of polykvd's peer channel (ZeroMQ CURVE, RFC 26): key pair files, the
// peer-keys file of trusted daemons, and tcp:// endpoint checks.
//
// Key files. A key pair file (`polykv-cli keys generate FILE`, mode 0600, refused when group
// or others may read it):
//     # polykvd CURVE key pair (Z85)
//     public = <40 chars>
//     secret = <40 chars>
// A peer-keys file: one line per trusted daemon, "<public key, 40 Z85 chars> [tcp://HOST:PORT]"
// ('#' at the start of a line or after a blank starts a comment; inside a key it is a Z85
// digit). Every key listed may connect to this daemon; the key on a line that names an
// endpoint is the one this daemon expects from the peer at that endpoint. One file may list
// the whole cluster and be shared by all its daemons.
#pragma once

#include <map>
#include <set>
#include <string>

#include "polykv/status.h"

namespace polykv::ipc {

/// A CURVE key pair as 40-char Z85 strings.
struct CurveKeyPair {
  std::string public_key, secret_key;
};

/// Generates a key pair (zmq_curve_keypair). Errors: kInternal (libzmq without CURVE).
[[nodiscard]] StatusOr<CurveKeyPair> GenerateCurveKeyPair();
/// The text of a key pair file (see the top of this file).
std::string CurveKeyPairFileText(const CurveKeyPair& keys);
/// Reads a key pair file. Errors: kNotFound, kPermissionDenied (readable by group or others:
/// names the mode), kInvalidArgument (malformed: names the line).
[[nodiscard]] StatusOr<CurveKeyPair> ReadCurveKeyPairFile(const std::string& path);

/// A parsed peer-keys file.
struct PeerKeys {
  std::set<std::string> trusted;                   ///< Z85 public keys allowed to connect
  std::map<std::string, std::string> by_endpoint;  ///< tcp://HOST:PORT -> its Z85 public key
};
/// Errors: kNotFound, kInvalidArgument naming the line (bad key, bad endpoint, an endpoint
/// listed twice with different keys).
[[nodiscard]] StatusOr<PeerKeys> ReadPeerKeysFile(const std::string& path);

/// Parses "tcp://HOST:PORT" (HOST: a name, an IPv4 address or "*"; PORT 1..65535).
/// Errors: kInvalidArgument naming `flag` and the text.
[[nodiscard]] Status CheckTcpEndpoint(const std::string& endpoint, const std::string& flag);

}  // namespace polykv::ipc
