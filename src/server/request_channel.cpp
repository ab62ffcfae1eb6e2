#include "server/request_channel.h"

namespace origami::server {

void RequestChannel::push(ChannelEvent event) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(event));
    notify = notify_;
  }
  if (notify) notify();
}

std::vector<ChannelEvent> RequestChannel::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ChannelEvent> out;
  out.swap(events_);
  return out;
}

void RequestChannel::set_notifier(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mutex_);
  notify_ = std::move(notify);
}

}  // namespace origami::server
