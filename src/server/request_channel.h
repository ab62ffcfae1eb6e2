#pragma once
// The hand-over between the engine thread and one HTTP request: the engine worker pushes what
// each step produced for the request's choices; the HTTP session drains it on its own thread.
// The worker never waits on a session: push() appends under a mutex and calls the notifier,
// which only schedules a wake-up on the session's executor.
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/request_output.h"

namespace origami::server {

struct ChannelEvent {
  int choice = 0;         // index of the choice (engine request) within the HTTP request
  RequestOutput output;   // new tokens/text of that choice, and whether it finished
  std::string rejection;  // non-empty: the engine refused the request (nothing else follows)
};

class RequestChannel {
 public:
  explicit RequestChannel(int num_choices) : num_choices_(num_choices) {}

  // Engine thread.
  void push(ChannelEvent event);
  // HTTP side: what arrived since the last call.
  std::vector<ChannelEvent> drain();
  // Called (engine thread) after each push; must not block.
  void set_notifier(std::function<void()> notify);

  int num_choices() const { return num_choices_; }

 private:
  const int num_choices_;
  std::mutex mutex_;
  std::vector<ChannelEvent> events_;
  std::function<void()> notify_;
};

}  // namespace origami::server
