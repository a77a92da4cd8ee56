// polykvd's peer daemons (pools shared between hosts): a ZeroMQ ROUTER on --listen tcp://
// with CURVE encryption and authentication (ZAP: only public keys in the peer-keys file are
// let in), DEALER calls to each --peer (PING for state, PEER_FETCH, PEER_RELEASE), and the
// bytes themselves moved by UCX one-sided reads (ipc/ucx_transfer.h): the holder exposes a
// read-only mapping of the pool's sealed memfd, the requester pulls it into a new region.
//
// Key files: polykv/ipc/curve_keys.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "polykv/ipc/curve_keys.h"
#include "polykv/ipc/protocol.h"
#include "polykv/ipc/ucx_transfer.h"
#include "polykv/status.h"
#include "pool_manager.h"

namespace polykv::daemon {

/// Configuration of the peer channel (DaemonOptions carries it).
struct PeerOptions {
  std::string listen;              ///< tcp://ADDR:PORT for other daemons ("" = none)
  std::vector<std::string> peers;  ///< tcp://HOST:PORT of the daemons asked for pools
  std::string key_file;            ///< this daemon's CURVE key pair file
  std::string peer_keys_file;      ///< trusted peers' public keys
  double ping_seconds = 2;         ///< how often peers' state is refreshed
  int call_timeout_ms = 3000;      ///< one PING / PEER_FETCH round trip
  /// A transfer the requester never released is dropped after this long (plus 1 s per 50 MB).
  double transfer_hold_seconds = 60;
  uint64_t chunk_bytes = 4ull << 20;  ///< bytes per UCX get
  int max_outstanding = 8;            ///< UCX gets in flight
  int stall_timeout_ms = 10000;       ///< a pull with no progress this long fails
  int test_chunk_delay_ms = 0;        ///< fault injection (tests): a slow link
  bool enabled() const { return !listen.empty() || !peers.empty(); }
};

/// The peer channel of one daemon. Thread-safe.
class Peers : public PeerSource {
 public:
  /// What the holder side needs from the daemon.
  struct Hooks {
    std::function<StatusOr<PoolExport>(const std::string& pool_id)> export_pool;
    std::function<std::vector<ipc::PoolInfo>()> list_pools;
    std::string instance;  ///< the daemon's instance id
    std::string version;   ///< the daemon's version
  };
  /// Reads the keys, creates the UCX engine, binds --listen (CURVE server) and starts the
  /// server and ping threads. Errors: kInvalidArgument (a --listen or --peer without key
  /// files: a daemon without keys refuses TCP; a --peer whose key the peer-keys file lacks;
  /// malformed endpoints), the key readers' errors, kUnavailable (bind, UCX).
  [[nodiscard]] static StatusOr<std::unique_ptr<Peers>> Start(PeerOptions options, Hooks hooks);
  ~Peers() override;

  [[nodiscard]] StatusOr<Offer> Find(const std::string& pool_id) override;
  [[nodiscard]] Status Pull(const Offer& offer, void* dst, uint64_t size,
                            const std::atomic<bool>* cancel,
                            const std::function<void(uint64_t, uint64_t)>& progress) override;
  void Release(const Offer& offer) override;

  /// The configured peers as last seen (PING replies).
  std::vector<ipc::PeerState> States() const;
  /// The endpoint --listen bound ("" when not listening).
  const std::string& listen_endpoint() const { return options_.listen; }
  /// Transfers the holder side serves right now.
  size_t active_transfers() const;

 private:
  Peers(PeerOptions options, Hooks hooks)
      : options_(std::move(options)), hooks_(std::move(hooks)) {}
  /// One request/reply with peer `endpoint` on a fresh CURVE DEALER (LINGER 0). A refused
  /// handshake is kPermissionDenied naming the peer; no answer is kUnavailable.
  [[nodiscard]] StatusOr<ipc::Reply> Call(const std::string& endpoint, ipc::Request request,
                                          int timeout_ms);
  void ServeLoop();
  void PingLoop();
  /// Answers one ZAP request (CURVE keys checked against the peer-keys file). Errors:
  /// ipc::ZmqErrorStatus.
  [[nodiscard]] Status HandleZap(zmq::socket_t& zap);
  /// Answers the requests waiting on the ROUTER (at most 64). Errors: ipc::ZmqErrorStatus
  /// (receiving; a reply that cannot be sent is logged).
  [[nodiscard]] Status HandleRequest(zmq::socket_t& router);
  ipc::Reply Answer(const ipc::Request& request);
  void SweepTransfers();
  void NoteState(const std::string& endpoint, const Status& status, const ipc::Reply* reply,
                 double rtt_ms);

  struct Transfer {
    PoolExport pool;
    std::unique_ptr<ipc::UcxExposure> exposure;
    std::chrono::steady_clock::time_point deadline;
  };

  PeerOptions options_;
  Hooks hooks_;
  ipc::CurveKeyPair keys_;
  ipc::PeerKeys peer_keys_;
  std::unique_ptr<ipc::UcxEngine> engine_;
  zmq::context_t ctx_;
  std::unique_ptr<zmq::socket_t> router_;  // used by the serve thread only
  std::unique_ptr<zmq::socket_t> zap_;     // used by the serve thread only
  std::thread serve_thread_, ping_thread_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  mutable std::mutex mu_;
  std::map<std::string, Transfer> transfers_;     // by transfer id
  std::map<std::string, ipc::PeerState> states_;  // by endpoint
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> monitor_seq_{0};
};

}  // namespace polykv::daemon
