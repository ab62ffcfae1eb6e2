#include "server/engine_worker.h"

namespace origami::server {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

EngineWorker::EngineWorker(std::unique_ptr<Engine> engine, MetricsRegistry* metrics, int max_waiting)
    : engine_(std::move(engine)), metrics_(metrics), max_waiting_(max_waiting) {
  publish_snapshot();
}

EngineWorker::~EngineWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    commands_.push_back(Command{Command::kAbortAll, {}, nullptr});
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::start() { thread_ = std::thread([this] { run(); }); }

bool EngineWorker::submit(Submission submission) {
  const int n = static_cast<int>(submission.prompts.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    if (max_waiting_ > 0 && num_waiting_.load() + queued_choices_ + n > max_waiting_) return false;
    queued_choices_ += n;
    ++num_active_;
    commands_.push_back(Command{Command::kSubmit, std::move(submission), nullptr});
  }
  wake_.notify_one();
  return true;
}

void EngineWorker::abort(const std::shared_ptr<RequestChannel>& channel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(Command{Command::kAbort, {}, channel});
  }
  wake_.notify_one();
}

void EngineWorker::abort_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(Command{Command::kAbortAll, {}, nullptr});
  }
  wake_.notify_one();
}

void EngineWorker::run() {
  for (;;) {
    std::vector<Command> commands;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !commands_.empty() || engine_->has_unfinished(); });
      commands.swap(commands_);
      for (const Command& c : commands)
        if (c.kind == Command::kSubmit) queued_choices_ -= static_cast<int>(c.submission.prompts.size());
      if (stopping_ && commands.empty() && !engine_->has_unfinished()) break;
    }
    for (Command& c : commands) apply(c);
    if (engine_->has_unfinished()) {
      std::vector<RequestOutput> outputs = engine_->step();
      // The step's metrics go out before its outputs reach the clients: a client that reads
      // /metrics after its response must see the work that produced it (a retained prompt's
      // tokens were missing from a read right after its response).
      publish_snapshot();
      route(outputs);
    }
    publish_snapshot();
  }
}

void EngineWorker::apply(Command& command) {
  switch (command.kind) {
    case Command::kSubmit: add(command.submission); break;
    case Command::kAbort: detach(command.channel.get()); break;
    case Command::kAbortAll: {
      // Requests are aborted, but their sessions still hear about it (finish reason "abort").
      drop_all_followers();
      for (auto& [id, c] : choices_) engine_->abort_request(id);
      break;
    }
  }
}

void EngineWorker::add(Submission& s) {
  RequestChannel* key = s.channel.get();
  Active& a = active_[key];
  a.channel = s.channel;
  a.options = s.options;
  a.arrival = s.arrival;
  a.unfinished = static_cast<int>(s.prompts.size());
  // With prefix caching, the n choices of a prompt share its KV blocks: the first is admitted
  // now, the others once it has prefilled (they then hit the cached prompt blocks).
  const bool share_prompt = engine_->config().enable_prefix_caching;
  std::vector<RequestId> leaders;  // per choice: the leader's id when it is a follower
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    RequestId leader = 0;
    if (share_prompt)
      for (size_t j = 0; j < i && leader == 0; ++j)
        if (s.prompts[j] == s.prompts[i] && j < a.ids.size()) leader = a.ids[j];
    if (leader != 0) {
      followers_[leader].push_back(Follower{static_cast<int>(i), std::move(s.prompts[i]), std::move(s.sampling[i])});
      a.ids.push_back(0);  // placeholder: keeps a.ids indexed by choice for later leaders
      continue;
    }
    if (!add_choice(a, key, static_cast<int>(i), s.prompts[i], s.sampling[i])) {
      // The engine refused it (bad value, prompt too long): nothing of this request runs.
      for (RequestId earlier : a.ids)
        if (earlier != 0) {
          followers_.erase(earlier);
          engine_->abort_request(earlier);
        }
      a.unfinished = 0;
      for (RequestId earlier : a.ids)
        if (earlier != 0) ++a.unfinished;  // the aborted ones still report, undelivered
      break;
    }
  }
  if (a.unfinished == 0) {
    active_.erase(key);
    --num_active_;
  }
}

bool EngineWorker::add_choice(Active& a, RequestChannel* key, int index, const std::vector<int32_t>& prompt,
                              const SamplingParams& sp) {
  Expected<RequestId> id = engine_->add_request(prompt, sp, a.options);
  if (!id) {
    metrics_->record_rejected();
    a.detached = true;
    ChannelEvent rejection;
    rejection.rejection = id.status().message();
    a.channel->push(std::move(rejection));
    return false;
  }
  if (static_cast<int>(a.ids.size()) <= index) a.ids.resize(index + 1, 0);
  a.ids[index] = *id;
  choices_.emplace(*id, Choice{key, index, a.arrival});
  return true;
}

void EngineWorker::release_followers(RequestId leader) {
  auto fit = followers_.find(leader);
  if (fit == followers_.end()) return;
  std::vector<Follower> followers = std::move(fit->second);
  followers_.erase(fit);
  const auto cit = choices_.find(leader);
  RequestChannel* key = cit->second.channel;
  Active& a = active_.at(key);
  for (Follower& f : followers) {
    if (!a.detached && add_choice(a, key, f.index, f.prompt, f.sampling)) continue;
    --a.unfinished;  // dropped (client gone) or refused: it never runs
  }
}

void EngineWorker::detach(RequestChannel* channel) {
  auto it = active_.find(channel);
  if (it == active_.end()) return;
  it->second.detached = true;
  for (RequestId id : it->second.ids)
    if (id != 0 && choices_.count(id)) engine_->abort_request(id);
}

void EngineWorker::route(std::vector<RequestOutput>& outputs) {
  for (RequestOutput& out : outputs) {
    auto cit = choices_.find(out.request_id);
    if (cit == choices_.end()) continue;
    cit->second.num_tokens += static_cast<int>(out.new_token_ids.size());
    if (cit->second.ttft < 0 && !out.new_token_ids.empty()) cit->second.ttft = seconds_since(cit->second.arrival);
    if (cit->second.num_tokens > 0 || out.finished) {
      release_followers(out.request_id);
      cit = choices_.find(out.request_id);  // admitting followers may rehash choices_
    }
    const Choice c = cit->second;
    auto ait = active_.find(c.channel);
    Active& a = ait->second;
    const bool finished = out.finished;
    if (finished) {
      metrics_->record_finished(finish_reason_name(out.finish_reason), c.ttft, seconds_since(c.arrival), c.num_tokens);
      engine_->release_request(out.request_id);
      choices_.erase(cit);
    }
    if (!a.detached) {
      ChannelEvent event;
      event.choice = c.index;
      event.output = std::move(out);
      a.channel->push(std::move(event));
    }
    if (finished && --a.unfinished == 0) {
      active_.erase(ait);
      --num_active_;
    }
  }
}

void EngineWorker::drop_all_followers() {
  for (auto& [leader, followers] : followers_) {
    Active& a = active_.at(choices_.at(leader).channel);
    for (const Follower& f : followers) {
      --a.unfinished;  // the leader is unfinished, so this never reaches 0
      if (a.detached) continue;
      metrics_->record_finished("abort", -1.0, seconds_since(a.arrival), 0);
      ChannelEvent event;
      event.choice = f.index;
      event.output.finished = true;
      event.output.finish_reason = FinishReason::kAborted;
      a.channel->push(std::move(event));
    }
  }
  followers_.clear();
}

void EngineWorker::publish_snapshot() {
  EngineSnapshot s;
  s.metrics = engine_->metrics();
  s.num_running = static_cast<int>(engine_->num_running());
  s.num_waiting = static_cast<int>(engine_->num_waiting());
  s.kv_blocks_used = engine_->num_kv_blocks_used();
  s.kv_blocks_total = s.metrics.num_kv_blocks_total;
  s.prefix_cache_queries = engine_->prefix_cache_stats().num_queried_tokens;
  s.prefix_cache_hits = engine_->prefix_cache_stats().num_hit_tokens;
  num_waiting_.store(s.num_waiting);
  metrics_->record_step(s);
}

}  // namespace origami::server
