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
      for (auto& [id, c] : choices_) engine_->abort_request(id);
      break;
    }
  }
}

void EngineWorker::add(Submission& s) {
  RequestChannel* key = s.channel.get();
  Active& a = active_[key];
  a.channel = s.channel;
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    Expected<RequestId> id = engine_->add_request(s.prompts[i], s.sampling[i], s.options);
    if (!id) {
      // The engine refused it (bad value, prompt too long): nothing of this request runs.
      metrics_->record_rejected();
      a.detached = true;
      for (RequestId earlier : a.ids) engine_->abort_request(earlier);
      ChannelEvent rejection;
      rejection.rejection = id.status().message();
      s.channel->push(std::move(rejection));
      break;
    }
    a.ids.push_back(*id);
    ++a.unfinished;
    choices_.emplace(*id, Choice{key, static_cast<int>(i), s.arrival});
  }
  if (a.unfinished == 0) {
    active_.erase(key);
    --num_active_;
  }
}

void EngineWorker::detach(RequestChannel* channel) {
  auto it = active_.find(channel);
  if (it == active_.end()) return;
  it->second.detached = true;
  for (RequestId id : it->second.ids)
    if (choices_.count(id)) engine_->abort_request(id);
}

void EngineWorker::route(std::vector<RequestOutput>& outputs) {
  for (RequestOutput& out : outputs) {
    auto cit = choices_.find(out.request_id);
    if (cit == choices_.end()) continue;
    Choice& c = cit->second;
    c.num_tokens += static_cast<int>(out.new_token_ids.size());
    if (c.ttft < 0 && !out.new_token_ids.empty()) c.ttft = seconds_since(c.arrival);
    auto ait = active_.find(c.channel);
    Active& a = ait->second;
    const bool finished = out.finished;
    if (finished)
      metrics_->record_finished(finish_reason_name(out.finish_reason), c.ttft, seconds_since(c.arrival), c.num_tokens);
    const int index = c.index;
    if (finished) {
      engine_->release_request(out.request_id);
      choices_.erase(cit);
    }
    if (!a.detached) {
      ChannelEvent event;
      event.choice = index;
      event.output = std::move(out);
      a.channel->push(std::move(event));
    }
    if (finished && --a.unfinished == 0) {
      active_.erase(ait);
      --num_active_;
    }
  }
}

void EngineWorker::publish_snapshot() {
  EngineSnapshot s;
  s.metrics = engine_->metrics();
  s.num_running = static_cast<int>(engine_->num_running());
  s.num_waiting = static_cast<int>(engine_->num_waiting());
  s.kv_blocks_used = engine_->num_kv_blocks_used();
  s.kv_blocks_total = s.metrics.num_kv_blocks_total;
  num_waiting_.store(s.num_waiting);
  metrics_->record_step(s);
}

}  // namespace origami::server
