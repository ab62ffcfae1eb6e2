#include "tokenizer/tokenizer.h"

#include <functional>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/json_excerpt.h"
#include "core/json_parse.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"

namespace origami {
namespace {

using nlohmann::json;

Expected<json> parse_json_object(std::string_view text, const std::string& where) {
  Expected<json> parsed = parse_json(text, kFileJsonMaxDepth);
  if (!parsed) return invalid_file(where + ": " + parsed.status().message());
  json j = std::move(*parsed);
  if (!j.is_object()) return invalid_file(where + ": the top level must be a JSON object");
  return j;
}

Expected<std::vector<AddedToken>> parse_added_tokens(const json& root, const std::string& where) {
  std::vector<AddedToken> out;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return out;
  const json& arr = root["added_tokens"];
  if (!arr.is_array()) return invalid_file(where + ": added_tokens must be an array");
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    const std::string field = where + ": added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() >= (int64_t{1} << 30) || !t.contains("content") || !t["content"].is_string()) {
      return invalid_file(field + " needs a non-negative integer 'id' and a string 'content'");
    }
    AddedToken a;
    a.id = t["id"].get<int32_t>();
    a.content = t["content"].get<std::string>();
    if (a.content.empty()) return invalid_file(field + " has an empty 'content'");
    ORIGAMI_ASSIGN_OR_RETURN(a.single_word, optional_bool(t, "single_word", false, field));
    ORIGAMI_ASSIGN_OR_RETURN(a.lstrip, optional_bool(t, "lstrip", false, field));
    ORIGAMI_ASSIGN_OR_RETURN(a.rstrip, optional_bool(t, "rstrip", false, field));
    ORIGAMI_ASSIGN_OR_RETURN(a.special, optional_bool(t, "special", false, field));
    ORIGAMI_ASSIGN_OR_RETURN(a.normalized, optional_bool(t, "normalized", !a.special, field));
    out.push_back(std::move(a));
  }
  return out;
}

// The ids a post-processor puts before and after a single sequence.
Status parse_post_processor(const json& p, const std::string& where,
                            const std::function<std::optional<int32_t>(const std::string&)>& id_of, int32_t vocab_size,
                            std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return Status::ok();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    return invalid_file(where + ": post_processor must be an object with a string 'type'");
  }
  const std::string type = p["type"];
  if (type == "ByteLevel") return Status::ok();  // only adjusts offsets
  if (type == "Sequence") {
    const json& processors = p.value("processors", json::array());
    if (!processors.is_array()) return invalid_file(where + ": post_processor.processors must be an array");
    for (const auto& child : processors) {
      ORIGAMI_RETURN_IF_ERROR(parse_post_processor(child, where, id_of, vocab_size, prefix, suffix));
    }
    return Status::ok();
  }
  if (type != "TemplateProcessing") {
    return invalid_file(where + ": unsupported post_processor type '" + type + "'");
  }
  const json& single = p.value("single", json());
  if (!single.is_array()) return invalid_file(where + ": TemplateProcessing without a 'single' array");
  const json& specials = p.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string()) {
      return invalid_file(where + ": TemplateProcessing 'single' items must be Sequence or SpecialToken with a string 'id'");
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    std::vector<int32_t> ids;
    if (specials.contains(name) && specials[name].contains("ids")) {
      const json& listed = specials[name]["ids"];
      if (!listed.is_array()) return invalid_file(where + ": TemplateProcessing special token '" + name + "' ids must be a list");
      for (const json& id : listed) {
        // The ids are emitted as they are: each must be a token of this vocabulary.
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
          return invalid_file(where + ": TemplateProcessing special token '" + name + "' has id " + json_excerpt(id) +
                              ", not in the vocabulary (" + std::to_string(vocab_size) + " ids)");
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    } else if (auto id = id_of(name)) {
      ids.push_back(*id);
    } else {
      return invalid_file(where + ": TemplateProcessing special token '" + name + "' has no id");
    }
    auto& dst = seen_sequence ? suffix : prefix;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  return Status::ok();
}

// A special token in tokenizer_config.json: a string, an {"content": ...} object, or null.
std::optional<std::string> token_string(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Expected<std::shared_ptr<Tokenizer>> Tokenizer::load(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "tokenizer.json";
  ORIGAMI_ASSIGN_OR_RETURN(std::string text, read_file(path));
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::optional<std::string> config;
  if (std::filesystem::exists(config_path)) {
    ORIGAMI_ASSIGN_OR_RETURN(config, read_file(config_path));
  }
  ORIGAMI_ASSIGN_OR_RETURN(std::shared_ptr<Tokenizer> t,
                           from_json_text(text, path.string(), config ? &*config : nullptr, config_path.string()));
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  if (t->chat_template_.empty() && std::filesystem::exists(jinja)) {
    ORIGAMI_ASSIGN_OR_RETURN(t->chat_template_, read_file(jinja));
  }
  return t;
}

Expected<std::shared_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view tokenizer_json, const std::string& source,
                                                               const std::string* config_json,
                                                               const std::string& config_source) {
  const std::string& where = source;
  ORIGAMI_ASSIGN_OR_RETURN(json root, parse_json_object(tokenizer_json, where));

  std::shared_ptr<Tokenizer> t(new Tokenizer());
  ORIGAMI_ASSIGN_OR_RETURN(t->normalizer_, Normalizer::from_json(root.value("normalizer", json()), where));
  ORIGAMI_ASSIGN_OR_RETURN(t->pre_tokenizer_, PreTokenizer::from_json(root.value("pre_tokenizer", json()), where));
  if (!root.contains("model")) return invalid_file(where + ": no 'model' section");
  ORIGAMI_ASSIGN_OR_RETURN(t->model_, BpeModel::from_json(root["model"], t->pre_tokenizer_.byte_level(), where));
  ORIGAMI_ASSIGN_OR_RETURN(t->decoder_, TokenDecoder::from_json(root.value("decoder", json()), where));
  ORIGAMI_ASSIGN_OR_RETURN(t->added_, parse_added_tokens(root, where));
  const json post_processor = root.value("post_processor", json());
  root = json();  // the parsed document is large; free it before building tables

  int32_t num_ids = t->model_->num_ids();
  // Added tokens follow the model's ids; an id far past them would make every id table that
  // large (memory out of proportion to the file).
  const int64_t id_limit = int64_t{num_ids} + static_cast<int64_t>(t->added_.size()) + 1024;
  for (size_t i = 0; i < t->added_.size(); ++i) {
    const AddedToken& a = t->added_[i];
    if (a.id >= id_limit) {
      return invalid_file(where + ": added_tokens[" + std::to_string(i) + "] id " + std::to_string(a.id) +
                          " is far beyond the vocabulary (" + std::to_string(t->model_->num_ids()) + " model ids, " +
                          std::to_string(t->added_.size()) + " added tokens)");
    }
    num_ids = std::max(num_ids, a.id + 1);
  }
  t->tokens_.resize(num_ids);
  for (int32_t id = 0; id < t->model_->num_ids(); ++id) t->tokens_[id] = t->model_->token(id);
  t->special_.assign(num_ids, 0);
  std::vector<AddedToken> raw, normalized;
  for (const AddedToken& a : t->added_) {
    t->tokens_[a.id] = a.content;
    t->special_[a.id] = a.special;
    t->added_ids_[a.content] = a.id;
    (a.normalized ? normalized : raw).push_back(a);
  }
  t->raw_matcher_ = AddedTokenMatcher(std::move(raw));
  t->normalized_matcher_ = AddedTokenMatcher(std::move(normalized));
  ORIGAMI_RETURN_IF_ERROR(t->decoder_.build(t->tokens_));

  auto id_of = [&](const std::string& s) { return t->token_to_id(s); };
  ORIGAMI_RETURN_IF_ERROR(
      parse_post_processor(post_processor, where, id_of, t->vocab_size(), t->prefix_ids_, t->suffix_ids_));
  if (config_json != nullptr) ORIGAMI_RETURN_IF_ERROR(t->load_config(*config_json, config_source));
  return t;
}

Status Tokenizer::load_config(std::string_view config_json, const std::string& where) {
  ORIGAMI_ASSIGN_OR_RETURN(json cfg, parse_json_object(config_json, where));
  for (const auto& [key, value] : cfg.items()) {
    if (key.size() > 6 && key.compare(key.size() - 6, 6, "_token") == 0) {
      if (auto s = token_string(value)) special_tokens_[key] = *s;
    }
  }
  for (const auto& [key, id] : std::initializer_list<std::pair<const char*, std::optional<int32_t>*>>{
           {"bos_token", &bos_id_}, {"eos_token", &eos_id_}}) {
    auto it = special_tokens_.find(key);
    if (it == special_tokens_.end()) continue;
    *id = token_to_id(it->second);
    if (!*id) return invalid_file(where + ": " + key + " '" + it->second + "' is not in the vocabulary");
  }
  if (auto it = special_tokens_.find("bos_token"); it != special_tokens_.end()) bos_token_ = it->second;
  if (auto it = special_tokens_.find("eos_token"); it != special_tokens_.end()) eos_token_ = it->second;
  // Explicit add_bos_token / add_eos_token replace what the post-processor adds.
  for (const auto& [key, ids, id] :
       std::initializer_list<std::tuple<const char*, std::vector<int32_t>*, std::optional<int32_t>>>{
           {"add_bos_token", &prefix_ids_, bos_id_}, {"add_eos_token", &suffix_ids_, eos_id_}}) {
    if (!cfg.contains(key) || cfg[key].is_null()) continue;
    if (!cfg[key].is_boolean()) return invalid_file(where + ": " + key + " must be a boolean");
    ids->clear();
    if (cfg[key].get<bool>()) {
      if (!id) return invalid_file(where + ": " + key + " is true but its token is not set");
      ids->push_back(*id);
    }
  }
  if (cfg.contains("chat_template")) {
    const json& ct = cfg["chat_template"];
    if (ct.is_string()) {
      chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {  // named templates: take "default", else the first
      for (const auto& named : ct) {
        if (!named.is_object() || !named.contains("template") || !named["template"].is_string()) {
          return invalid_file(where + ": chat_template entries need a string 'template'");
        }
        if (chat_template_.empty() || (named.contains("name") && named["name"] == "default")) {
          chat_template_ = named["template"].get<std::string>();
        }
      }
    } else if (!ct.is_null()) {
      return invalid_file(where + ": chat_template must be a string or a list of named templates");
    }
  }
  return Status::ok();
}

void Tokenizer::encode_plain(std::string_view text, bool at_text_start, std::vector<int32_t>& ids) const {
  std::deque<std::string> storage;
  std::string normalized;
  if (!normalizer_.empty()) {
    normalized = normalizer_.normalize(text);
    text = normalized;
  }
  auto encode_stretch = [&](std::string_view stretch, bool first) {
    std::vector<std::string_view> local_words;
    pre_tokenizer_.split(stretch, first, local_words, storage);
    for (std::string_view w : local_words) model_->encode_word(w, ids);
  };
  if (normalized_matcher_.empty()) {
    encode_stretch(text, at_text_start);
    return;
  }
  std::vector<TextSegment> segments;
  normalized_matcher_.split(text, segments);
  for (const TextSegment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      encode_stretch(s.text, at_text_start && s.text.data() == text.data());
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(input)) {
    repaired = unicode::to_valid_utf8(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(input.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  if (raw_matcher_.empty()) {
    encode_plain(input, true, ids);
  } else {
    std::vector<TextSegment> segments;
    raw_matcher_.split(input, segments);
    for (const TextSegment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encode_plain(s.text, s.text.data() == input.data(), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string out;
  DecodeState state(decoder_);
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special_tokens && special_[id]) continue;
    state.push(id, out);
  }
  state.finish(out);
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(tokens_.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  return model_->find(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tokens_[id];
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[id]; }

}  // namespace origami
