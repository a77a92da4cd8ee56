// UcxEngine: one UCX context, a serving worker progressed by a background thread, regions
// exposed with ucp_mem_map + ucp_rkey_pack, and chunked, pipelined ucp_get_nbx pulls on a
// temporary per-call worker (see polykv/ipc/ucx_transfer.h).
#include "polykv/ipc/ucx_transfer.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace polykv::ipc {
namespace {

using Clock = std::chrono::steady_clock;

// Descriptor wire format (all integers little endian):
//   u32 magic "PKVX" | u32 version | u32 worker address length | worker address bytes |
//   u64 remote address | u64 size | u32 rkey length | rkey bytes
// Nothing may follow the rkey.
constexpr uint32_t kDescriptorMagic = 0x58564B50;  // "PKVX" read as little endian
constexpr uint32_t kDescriptorVersion = 1;
constexpr uint32_t kMaxBlobBytes = 1u << 20;  // sanity bound for address and rkey lengths

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Bounds-checked little-endian reader over a descriptor.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool U32(uint32_t* v) {
    if (s_.size() - pos_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i)
      *v |= static_cast<uint32_t>(static_cast<uint8_t>(s_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (s_.size() - pos_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i)
      *v |= static_cast<uint64_t>(static_cast<uint8_t>(s_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool Bytes(uint32_t n, std::string* out) {
    if (s_.size() - pos_ < n) return false;
    out->assign(s_, pos_, n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

struct Descriptor {
  std::string worker_address;
  uint64_t remote_address = 0;
  uint64_t size = 0;
  std::string rkey;
};

std::string EncodeDescriptor(const Descriptor& d) {
  std::string s;
  s.reserve(32 + d.worker_address.size() + d.rkey.size());
  PutU32(&s, kDescriptorMagic);
  PutU32(&s, kDescriptorVersion);
  PutU32(&s, static_cast<uint32_t>(d.worker_address.size()));
  s += d.worker_address;
  PutU64(&s, d.remote_address);
  PutU64(&s, d.size);
  PutU32(&s, static_cast<uint32_t>(d.rkey.size()));
  s += d.rkey;
  return s;
}

StatusOr<Descriptor> DecodeDescriptor(const std::string& s) {
  Reader r(s);
  uint32_t magic = 0, version = 0, addr_len = 0, rkey_len = 0;
  Descriptor d;
  if (!r.U32(&magic) || magic != kDescriptorMagic) {
    return absl::InvalidArgumentError("ucx descriptor: bad magic or truncated");
  }
  if (!r.U32(&version) || version != kDescriptorVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx descriptor: unsupported version ", version));
  }
  if (!r.U32(&addr_len) || addr_len == 0 || addr_len > kMaxBlobBytes ||
      !r.Bytes(addr_len, &d.worker_address)) {
    return absl::InvalidArgumentError("ucx descriptor: bad worker address length or truncated");
  }
  if (!r.U64(&d.remote_address) || !r.U64(&d.size)) {
    return absl::InvalidArgumentError("ucx descriptor: truncated address/size");
  }
  if (d.size == 0) return absl::InvalidArgumentError("ucx descriptor: size 0");
  if (!r.U32(&rkey_len) || rkey_len == 0 || rkey_len > kMaxBlobBytes ||
      !r.Bytes(rkey_len, &d.rkey)) {
    return absl::InvalidArgumentError("ucx descriptor: bad rkey length or truncated");
  }
  if (!r.AtEnd()) return absl::InvalidArgumentError("ucx descriptor: trailing bytes");
  return d;
}

Status UcxError(const char* call, ucs_status_t st) {
  return absl::UnavailableError(absl::StrCat(call, ": ", ucs_status_string(st)));
}

// The context, shared by the engine and its exposures (an exposure may outlive the engine).
struct Core {
  ucp_context_h context = nullptr;
  std::mutex mu;  // serializes ucp_mem_map / ucp_rkey_pack / ucp_mem_unmap
  ~Core() {
    if (context != nullptr) ucp_cleanup(context);
  }
};

class UcxExposureImpl final : public UcxExposure {
 public:
  UcxExposureImpl(std::shared_ptr<Core> core, ucp_mem_h memh, std::string descriptor, uint64_t size)
      : core_(std::move(core)), memh_(memh), descriptor_(std::move(descriptor)), size_(size) {}
  ~UcxExposureImpl() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    (void)ucp_mem_unmap(core_->context, memh_);
  }
  const std::string& descriptor() const override { return descriptor_; }
  uint64_t size() const override { return size_; }

 private:
  std::shared_ptr<Core> core_;
  ucp_mem_h memh_;
  std::string descriptor_;
  uint64_t size_;
};

// One ucp_get_nbx in flight. Lives in a vector that outlives the pull's worker, so a late
// completion callback never touches freed memory.
struct Slot {
  void* request = nullptr;  // non-null while a request is outstanding
  bool done = false;        // set by the callback
  ucs_status_t status = UCS_OK;
  uint64_t length = 0;
};

void GetCallback(void* /*request*/, ucs_status_t status, void* user_data) {
  auto* slot = static_cast<Slot*>(user_data);
  slot->status = status;
  slot->done = true;
}

struct EpError {
  bool failed = false;
  ucs_status_t status = UCS_OK;
};

void EpErrorCallback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* e = static_cast<EpError*>(arg);
  e->failed = true;
  e->status = status;
}

// Progresses `worker` until it has nothing to do, then sleeps on its event fd at most
// `timeout_ms` (0: only progress). Returns true when something progressed.
bool ProgressOrWait(ucp_worker_h worker, int efd, int timeout_ms) {
  bool any = false;
  while (ucp_worker_progress(worker) != 0) any = true;
  if (any || timeout_ms <= 0) return any;
  if (efd < 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    return false;
  }
  ucs_status_t st = ucp_worker_arm(worker);
  if (st == UCS_ERR_BUSY) return true;  // events pending: progress again
  if (st != UCS_OK) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    return false;
  }
  pollfd p{efd, POLLIN, 0};
  (void)poll(&p, 1, timeout_ms);
  return false;
}

class UcxEngineImpl final : public UcxEngine {
 public:
  UcxEngineImpl() = default;
  ~UcxEngineImpl() override {
    if (thread_.joinable()) {
      stop_.store(true);
      uint64_t one = 1;
      (void)!write(wake_fd_, &one, sizeof(one));
      thread_.join();
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  Status Init() {
    core_ = std::make_shared<Core>();
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return UcxError("ucp_config_read", st);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;  // pulls run workers of their own on several threads
    st = ucp_init(&params, config, &core_->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
      core_->context = nullptr;
      return UcxError("ucp_init", st);
    }
    // The serving worker: only the progress thread touches it once started.
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(core_->context, &wp, &worker_);
    if (st != UCS_OK) {
      worker_ = nullptr;
      return UcxError("ucp_worker_create", st);
    }
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
    worker_address_.assign(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) return UcxError("ucp_worker_get_efd", st);
    transports_ = QueryTransports();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::UnavailableError("eventfd failed");
    try {
      thread_ = std::thread([this] { ProgressLoop(); });
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("progress thread: ", e.what()));
    }
    return absl::OkStatus();
  }

  StatusOr<std::unique_ptr<UcxExposure>> Expose(const void* data, uint64_t size) override {
    if (data == nullptr || size == 0) {
      return absl::InvalidArgumentError("Expose: null data or size 0");
    }
    std::lock_guard<std::mutex> lock(core_->mu);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = const_cast<void*>(data);
    mp.length = size;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(core_->context, &mp, &memh);
    if (st != UCS_OK) return UcxError("ucp_mem_map", st);
    void* rkey_buf = nullptr;
    size_t rkey_len = 0;
    st = ucp_rkey_pack(core_->context, memh, &rkey_buf, &rkey_len);
    if (st != UCS_OK) {
      (void)ucp_mem_unmap(core_->context, memh);
      return UcxError("ucp_rkey_pack", st);
    }
    Descriptor d;
    d.worker_address = worker_address_;
    d.remote_address = reinterpret_cast<uint64_t>(data);
    d.size = size;
    d.rkey.assign(static_cast<const char*>(rkey_buf), rkey_len);
    ucp_rkey_buffer_release(rkey_buf);
    std::unique_ptr<UcxExposure> e;
    try {
      e = std::make_unique<UcxExposureImpl>(core_, memh, EncodeDescriptor(d), size);
    } catch (const std::bad_alloc&) {
      (void)ucp_mem_unmap(core_->context, memh);
      return absl::ResourceExhaustedError("Expose: out of memory");
    }
    return e;
  }

  Status Pull(const std::string& descriptor, void* dst, uint64_t size,
              const UcxPullOptions& options) override {
    try {
      return PullImpl(descriptor, dst, size, options);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("Pull: ", e.what()));
    }
  }

  std::string transports() const override { return transports_; }

 private:
  void ProgressLoop() {
    while (!stop_.load(std::memory_order_relaxed)) {
      while (ucp_worker_progress(worker_) != 0) {
      }
      ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_ERR_BUSY) continue;
      pollfd p[2] = {{efd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      // A short timeout also covers transports whose progress needs no event.
      (void)poll(p, 2, st == UCS_OK ? 100 : 1);
    }
  }

  // Parses ucp_context_print_info: lines "#      resource 1  :  md 1  dev 1  flags -- tcp/lo".
  std::string QueryTransports() {
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr) return "";
    ucp_context_print_info(core_->context, f);
    std::fclose(f);
    std::string text(buf, len);
    std::free(buf);
    std::vector<std::string> names;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      const std::string line = text.substr(pos, eol - pos);
      pos = eol + 1;
      const size_t dash = line.find("-- ");
      if (line.find("resource") == std::string::npos || dash == std::string::npos) continue;
      const size_t slash = line.find('/', dash);
      if (slash == std::string::npos) continue;
      std::string tl = line.substr(dash + 3, slash - dash - 3);
      if (!tl.empty() && std::find(names.begin(), names.end(), tl) == names.end()) {
        names.push_back(tl);
      }
    }
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
  }

  // "Pull: <what> after <done> of <size> bytes: <UCX status>" (kUnavailable).
  static Status PullUnavailable(const char* what, ucs_status_t st, uint64_t done, uint64_t size) {
    return absl::UnavailableError(absl::StrCat("Pull: ", what, " after ", done, " of ", size,
                                               " bytes: ", ucs_status_string(st)));
  }

  // Issues a get of up to `chunk` bytes into every free slot until `*issued` reaches `size`.
  static Status IssueGets(ucp_ep_h ep, ucp_rkey_h rkey, uint8_t* out, uint64_t remote_address,
                          uint64_t size, uint64_t chunk, uint64_t done, std::vector<Slot>* slots,
                          uint64_t* issued) {
    for (Slot& s : *slots) {
      if (*issued >= size) break;
      if (s.request != nullptr || s.length != 0) continue;
      const uint64_t len = std::min<uint64_t>(chunk, size - *issued);
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rp.cb.send = GetCallback;
      rp.user_data = &s;
      s.done = false;
      s.status = UCS_OK;
      ucs_status_ptr_t req =
          ucp_get_nbx(ep, out + *issued, len, remote_address + *issued, rkey, &rp);
      if (UCS_PTR_IS_ERR(req)) {
        return PullUnavailable("transfer failed (ucp_get_nbx)", UCS_PTR_STATUS(req), done, size);
      }
      s.length = len;
      if (req == nullptr) {
        s.done = true;  // completed in place
      } else {
        s.request = req;
      }
      *issued += len;
    }
    return absl::OkStatus();
  }

  // Frees every completed slot, adding its bytes to `*done` (progress reported, test delay
  // applied); `*completed` when any finished well. Returns the first failed completion.
  static Status ReapCompletions(uint64_t size, const UcxPullOptions& options,
                                std::vector<Slot>* slots, uint64_t* done, bool* completed) {
    Status result = absl::OkStatus();
    for (Slot& s : *slots) {
      if (s.length == 0 || !s.done) continue;
      if (s.request != nullptr) {
        ucp_request_free(s.request);
        s.request = nullptr;
      }
      if (s.status != UCS_OK) {
        if (result.ok())
          result = PullUnavailable("transfer failed (get completion)", s.status, *done, size);
        s.length = 0;
        continue;
      }
      *done += s.length;
      s.length = 0;
      *completed = true;
      if (options.progress) options.progress(*done, size);
      if (options.test_chunk_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options.test_chunk_delay_ms));
      }
    }
    return result;
  }

  Status PullImpl(const std::string& descriptor, void* dst, uint64_t size,
                  const UcxPullOptions& options) {
    POLYKV_ASSIGN_OR_RETURN(Descriptor d, DecodeDescriptor(descriptor));
    if (d.size != size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: size ", size, " does not match the exposed size ", d.size));
    }
    if (dst == nullptr) return absl::InvalidArgumentError("Pull: null destination");
    if (options.chunk_bytes < 4096) {
      return absl::InvalidArgumentError("Pull: chunk_bytes must be >= 4096");
    }
    if (options.max_outstanding < 1) {
      return absl::InvalidArgumentError("Pull: max_outstanding must be >= 1");
    }
    const int stall_ms = std::max(1, options.stall_timeout_ms);

    // Declared first so it outlives the worker: late callbacks write into it.
    std::vector<Slot> slots(static_cast<size_t>(options.max_outstanding));
    EpError ep_error;

    ucp_worker_h worker = nullptr;
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    int efd = -1;
    uint64_t issued = 0, done = 0;
    Status result = absl::OkStatus();

    auto fail_unavailable = [&](const char* what, ucs_status_t st) {
      return PullUnavailable(what, st, done, size);
    };

    do {
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SINGLE;
      ucs_status_t st = ucp_worker_create(core_->context, &wp, &worker);
      if (st != UCS_OK) {
        worker = nullptr;
        result = UcxError("ucp_worker_create", st);
        break;
      }
      if (ucp_worker_get_efd(worker, &efd) != UCS_OK) efd = -1;
      ucp_ep_params_t ep_params{};
      ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep_params.address = reinterpret_cast<const ucp_address_t*>(d.worker_address.data());
      ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep_params.err_handler.cb = EpErrorCallback;
      ep_params.err_handler.arg = &ep_error;
      st = ucp_ep_create(worker, &ep_params, &ep);
      if (st != UCS_OK) {
        ep = nullptr;
        result = fail_unavailable("ucp_ep_create", st);
        break;
      }
      st = ucp_ep_rkey_unpack(ep, d.rkey.data(), &rkey);
      if (st != UCS_OK) {
        rkey = nullptr;
        // A well-formed envelope around a corrupt key is still a bad descriptor.
        result = absl::InvalidArgumentError(
            absl::StrCat("ucx descriptor: ucp_ep_rkey_unpack: ", ucs_status_string(st)));
        break;
      }

      uint8_t* out = static_cast<uint8_t*>(dst);
      auto last_completion = Clock::now();
      while (done < size) {
        if (options.cancel != nullptr && options.cancel->load()) {
          result = absl::CancelledError(
              absl::StrCat("Pull: cancelled after ", done, " of ", size, " bytes"));
          break;
        }
        if (ep_error.failed) {
          result = fail_unavailable("peer failed", ep_error.status);
          break;
        }
        // Issue gets into free slots.
        result = IssueGets(ep, rkey, out, d.remote_address, size, options.chunk_bytes, done, &slots,
                           &issued);
        if (!result.ok()) break;
        // Reap completions.
        bool completed = false;
        result = ReapCompletions(size, options, &slots, &done, &completed);
        if (!result.ok()) break;
        if (completed) {
          last_completion = Clock::now();
          continue;
        }
        if (done >= size) break;
        const auto idle =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_completion)
                .count();
        if (idle >= stall_ms) {
          result = absl::DeadlineExceededError(absl::StrCat(
              "Pull: no progress for ", stall_ms, " ms after ", done, " of ", size, " bytes"));
          break;
        }
        // Spin briefly (the data path), then sleep on the event fd.
        bool any = false;
        for (int i = 0; i < 64 && !any; ++i) any = ProgressOrWait(worker, efd, 0);
        if (!any) {
          const int wait = static_cast<int>(std::min<int64_t>(10, stall_ms - idle));
          (void)ProgressOrWait(worker, efd, std::max(1, wait));
        }
      }
    } while (false);

    Cleanup(worker, ep, rkey, efd, &slots, !result.ok());
    return result;
  }

  // Cancels and waits for outstanding gets, destroys the rkey, closes the endpoint (forced
  // after an error) and destroys the worker. Bounded in time on every path.
  static void Cleanup(ucp_worker_h worker, ucp_ep_h ep, ucp_rkey_h rkey, int efd,
                      std::vector<Slot>* slots, bool failed) {
    if (worker == nullptr) return;
    auto outstanding = [&] {
      for (const Slot& s : *slots) {
        if (s.request != nullptr && !s.done) return true;
      }
      return false;
    };
    auto wait_outstanding = [&](int ms) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
      while (outstanding() && Clock::now() < deadline) (void)ProgressOrWait(worker, efd, 1);
    };
    auto free_done = [&] {
      for (Slot& s : *slots) {
        if (s.request != nullptr && s.done) {
          ucp_request_free(s.request);
          s.request = nullptr;
        }
      }
    };
    for (Slot& s : *slots) {
      if (s.request != nullptr && !s.done) ucp_request_cancel(worker, s.request);
    }
    wait_outstanding(failed ? 300 : 2000);
    const bool stuck = outstanding();
    // The rkey goes before its endpoint, unless gets are still stuck on it: then the forced
    // close completes them (UCS_ERR_CANCELED) first.
    if (!stuck && rkey != nullptr) {
      free_done();
      ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
    if (ep != nullptr) {
      ucp_request_param_t cp{};
      cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      cp.flags = (failed || stuck) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &cp);
      if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        const auto deadline = Clock::now() + std::chrono::milliseconds(failed ? 1000 : 2000);
        while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < deadline) {
          (void)ProgressOrWait(worker, efd, 1);
        }
        if (ucp_request_check_status(req) == UCS_INPROGRESS) {
          // A graceful close that did not finish: force it.
          ucp_request_free(req);
          cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
          req = ucp_ep_close_nbx(ep, &cp);
          if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
            const auto d2 = Clock::now() + std::chrono::milliseconds(500);
            while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < d2) {
              (void)ProgressOrWait(worker, efd, 1);
            }
            ucp_request_free(req);
          }
        } else {
          ucp_request_free(req);
        }
      }
    }
    wait_outstanding(200);
    free_done();
    if (rkey != nullptr) ucp_rkey_destroy(rkey);
    // Requests still not complete are released by UCX when the worker goes (their slots
    // outlive the worker).
    for (Slot& s : *slots) {
      if (s.request != nullptr) {
        ucp_request_free(s.request);
        s.request = nullptr;
      }
    }
    ucp_worker_destroy(worker);
  }

  std::shared_ptr<Core> core_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int wake_fd_ = -1;
  std::string worker_address_;
  std::string transports_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<UcxEngine>> UcxEngine::Create() {
  try {
    auto engine = std::make_unique<UcxEngineImpl>();
    POLYKV_RETURN_IF_ERROR(engine->Init());
    return std::unique_ptr<UcxEngine>(std::move(engine));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("UcxEngine::Create: ", e.what()));
  }
}

}  // namespace polykv::ipc
