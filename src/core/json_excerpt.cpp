#include "core/json_excerpt.h"

#include <vector>

namespace origami {
namespace {

std::string dump_scalar(const nlohmann::json& v, size_t max_bytes) {
  if (!v.is_string()) return v.dump();
  // A long string is cut before escaping: escaping only lengthens it.
  const std::string& s = v.get_ref<const std::string&>();
  const nlohmann::json head = s.size() > max_bytes + 1 ? nlohmann::json(s.substr(0, max_bytes + 1)) : v;
  return head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string text_excerpt(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
  return std::string(text.substr(0, cut)) + "...";
}

std::string json_excerpt(const nlohmann::json& value, size_t max_bytes) {
  std::string out;
  // An explicit stack of open containers, each with its next element.
  struct Frame {
    const nlohmann::json* container;
    nlohmann::json::const_iterator next;
  };
  std::vector<Frame> stack;
  const nlohmann::json* pending = &value;  // the value to print next, if any
  while (out.size() <= max_bytes) {
    if (pending != nullptr) {
      const nlohmann::json& v = *pending;
      pending = nullptr;
      if (v.is_array() || v.is_object()) {
        out += v.is_array() ? '[' : '{';
        stack.push_back({&v, v.cbegin()});
      } else {
        out += dump_scalar(v, max_bytes);
      }
      continue;
    }
    if (stack.empty()) break;
    Frame& top = stack.back();
    if (top.next == top.container->cend()) {
      out += top.container->is_array() ? ']' : '}';
      stack.pop_back();
      continue;
    }
    if (top.next != top.container->cbegin()) out += ',';
    if (top.container->is_object()) out += nlohmann::json(top.next.key()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + ':';
    pending = &*top.next;
    ++top.next;
  }
  if (out.size() > max_bytes) {
    out.resize(max_bytes);
    out += "...";
  }
  return out;
}

}  // namespace origami
