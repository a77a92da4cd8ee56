// polykvd's creates and fetches (see daemon.h): single flight (an identical CREATE_POOL joins
// the one queued or running), admission to the bounded queue, the worker threads, and the
// PROGRESS messages and heartbeats the control loop forwards.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon_internal.h"
#include "serve_guarded.h"

namespace polykv::daemon {

/// (the requester decides which model paths may be opened). Length-prefixed, so no two
/// different requests give one key.
std::string CreateWorkKey(const ipc::Request& r, const Requester& who) {
  std::string key;
  auto add = [&key](absl::string_view part) { absl::StrAppend(&key, part.size(), ":", part, ";"); };
  add(r.model);
  add(r.document);
  add(absl::StrJoin(r.token_ids, ","));
  add(r.codec);
  add(r.key_scale);
  add(r.parent);
  absl::StrAppend(&key, r.add_bos ? 1 : 0, r.norm_correction ? 1 : 0, ";", who.uid, ";",
                  who.trusted_paths ? 1 : 0);
  return key;
}

void CreateWorker(std::shared_ptr<CreateShared> shared, std::shared_ptr<std::atomic<bool>> done) {
  for (;;) {
    CreateJob job;
    {
      std::unique_lock<std::mutex> lock(shared->mu);
      shared->cv.wait(lock, [&] { return shared->stop || !shared->queue.empty(); });
      if (shared->stop) break;
      job = std::move(shared->queue.front());
      shared->queue.pop_front();
      ++shared->running;
    }
    const ipc::Request& req = job.request;
    auto last = Clock::now() - std::chrono::seconds(1);
    std::string last_stage;
    ProgressFn progress = [&](const std::string& stage, int64_t d, int64_t total) {
      // At most ~20 PROGRESS messages a second, but always the first and last of a stage.
      auto now = Clock::now();
      if (stage == last_stage && d != 0 && d != total &&
          now - last < std::chrono::milliseconds(50)) {
        return;
      }
      last = now;
      last_stage = stage;
      ipc::Reply p;
      p.type = ipc::MessageType::kProgress;
      p.id = req.id;
      p.stage = stage;
      p.done = d;
      p.total = total;
      shared->Post(CreateEvent{job.key, std::move(p), false});
    };
    ipc::Reply reply = ServeGuarded(req, shared->metrics.get(), [&] {
      ipc::Reply r;
      r.type = req.type;
      r.id = req.id;
      // CREATE_POOL; or FETCH, or an ATTACH of a pool this daemon does not hold: replicate.
      StatusOr<CreateResult> result =
          req.type == ipc::MessageType::kCreatePool
              ? shared->manager->CreatePool(req, progress, job.who, job.cancel.get())
              : shared->manager->Replicate(req.pool_id, job.cancel.get(), progress);
      if (result.ok() && req.type == ipc::MessageType::kAttach) {
        auto g = shared->manager->Attach(result->info.id, req.client_pid);
        if (!g.ok()) {
          result = g.status();
        } else {
          r.lease_id = g->lease_id;
          r.lease_expires_unix_ms = g->expires_unix_ms;
          r.lease_ms = g->lease_ms;
          r.memory = g->memory;
          result->info = g->info;
        }
      }
      if (!result.ok()) return ipc::ErrorReply(req.type, req.id, result.status());
      r.pool = result->info;
      r.created = result->created;
      if (result->created && !result->restored && !result->replicated) {
        shared->metrics->AddPrefill(result->info.tokens);
      }
      return r;
    });
    shared->Post(CreateEvent{job.key, std::move(reply), true});
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      --shared->running;
    }
  }
  done->store(true);
}

void Daemon::Impl::StartCreate(std::string identity, bool delimiter, ipc::Request req,
                               Requester who) {
  CreateJob job;
  job.key = ++next_key;
  job.who = who;
  job.cancel = std::make_shared<std::atomic<bool>>(false);
  Tracked t;
  t.identity = std::move(identity);
  t.delimiter = delimiter;
  t.request_id = req.id;
  t.type = req.type;
  t.progress = req.progress;
  t.cancel = job.cancel;
  if (req.type == ipc::MessageType::kCreatePool) {
    // Single flight, before admission control: the same work already queued or running is
    // joined (no queue slot taken); only distinct work is counted against the queue.
    t.work_key = CreateWorkKey(req, who);
    if (auto same = creates_by_work.find(t.work_key); same != creates_by_work.end()) {
      Tracked& leader = tracked.at(same->second);
      Tracked::Joined j{t.identity, t.delimiter,  t.request_id,
                        t.progress, Clock::now(), Clock::now()};
      metrics->AddCoalescedCreate();
      spdlog::info("create id={} joins the identical create id={} in flight ({} joined)",
                   t.request_id, leader.request_id, leader.joined.size() + 1);
      if (j.progress) {
        ipc::Reply p;
        p.type = ipc::MessageType::kProgress;
        p.id = j.request_id;
        p.stage = leader.stage;
        p.done = leader.done;
        p.total = leader.total;
        Send(j.identity, j.delimiter, p);
      }
      leader.joined.push_back(std::move(j));
      return;
    }
  }
  size_t queued = 0, running = 0;
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(creates->mu);
    queued = creates->queue.size();
    running = creates->running;
    full = queued + running >= creates->capacity + creates->workers;
    if (!full) {
      job.request = std::move(req);
      creates->queue.push_back(std::move(job));
    }
  }
  if (full) {
    spdlog::warn("refused a create: {} queued, {} running", queued, running);
    SendRefusal(t.identity, t.delimiter,
                ipc::ErrorReply(
                    t.type, t.request_id,
                    absl::ResourceExhaustedError(absl::StrCat(
                        "the create queue is full (", queued, " waiting, ", running,
                        " running; --max-queued-creates ", creates->capacity, "): retry later"))));
    return;
  }
  creates->cv.notify_one();
  const uint64_t key = next_key;
  t.last_sent = Clock::now();
  if (t.progress) {
    ipc::Reply p;
    p.type = ipc::MessageType::kProgress;
    p.id = t.request_id;
    p.stage = "queued";
    p.done = static_cast<int64_t>(queued);
    p.total = static_cast<int64_t>(queued);
    Send(t.identity, t.delimiter, p);
  }
  if (!t.work_key.empty()) creates_by_work[t.work_key] = key;
  tracked.emplace(key, std::move(t));
}

void Daemon::Impl::Untrack(std::map<uint64_t, Tracked>::iterator it) {
  if (!it->second.work_key.empty()) {
    auto w = creates_by_work.find(it->second.work_key);
    if (w != creates_by_work.end() && w->second == it->first) creates_by_work.erase(w);
  }
  tracked.erase(it);
}

void Daemon::Impl::ForwardEvents() {
  uint64_t counter;
  (void)!read(creates->event_fd.get(), &counter, sizeof(counter));
  std::deque<CreateEvent> events;
  {
    std::lock_guard<std::mutex> lock(creates->mu);
    events.swap(creates->events);
  }
  for (CreateEvent& e : events) {
    auto it = tracked.find(e.key);
    if (it == tracked.end()) continue;  // already answered (cancelled at shutdown)
    Tracked& t = it->second;
    if (e.final) {
      // The joined creates get the same answer under their own request ids; the pool was
      // made by the first one (created = false for the others, as for any create that
      // finds its pool made by another).
      for (const Tracked::Joined& j : t.joined) {
        ipc::Reply r = e.reply;
        r.id = j.request_id;
        r.created = false;
        metrics->ObserveRequest(t.type, r,
                                std::chrono::duration<double>(Clock::now() - j.joined_at).count());
        Send(j.identity, j.delimiter, std::move(r));
      }
      Send(t.identity, t.delimiter, std::move(e.reply));
      Untrack(it);
      continue;
    }
    t.stage = e.reply.stage;
    t.done = e.reply.done;
    t.total = e.reply.total;
    const auto now = Clock::now();
    for (Tracked::Joined& j : t.joined) {
      if (!j.progress) continue;
      ipc::Reply p = e.reply;
      p.id = j.request_id;
      j.last_sent = now;
      Send(j.identity, j.delimiter, std::move(p));
    }
    if (t.progress) {
      t.last_sent = now;
      Send(t.identity, t.delimiter, std::move(e.reply));
    }
  }
}

void Daemon::Impl::Heartbeats() {
  const auto now = Clock::now();
  const auto due = [&](bool progress, Clock::time_point last) {
    return progress && now - last >= std::chrono::milliseconds(ipc::kHeartbeatMs);
  };
  for (auto& [key, t] : tracked) {
    ipc::Reply p;
    p.type = ipc::MessageType::kProgress;
    p.stage = t.stage;
    p.done = t.done;
    p.total = t.total;
    p.heartbeat = true;
    for (Tracked::Joined& j : t.joined) {
      if (!due(j.progress, j.last_sent)) continue;
      p.id = j.request_id;
      j.last_sent = now;
      Send(j.identity, j.delimiter, p);
    }
    if (!due(t.progress, t.last_sent)) continue;
    p.id = t.request_id;
    t.last_sent = now;
    Send(t.identity, t.delimiter, p);
  }
}

}  // namespace polykv::daemon
