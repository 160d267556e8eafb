// interp/scale.cpp - rewrites the integer sizes under `sizes:` (yaml-cpp round trip).
#include "interp/scale.h"

#include <yaml-cpp/yaml.h>

#include <charconv>

namespace spmd {

namespace {

bool as_int(const YAML::Node& n, std::int64_t& v) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && v > 0;
}

}  // namespace

std::map<std::string, std::int64_t> named_sizes(const std::string& yaml_text) {
  std::map<std::string, std::int64_t> out;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap() || !root["sizes"].IsMap()) return out;
    for (auto it = root["sizes"].begin(); it != root["sizes"].end(); ++it) {
      const YAML::Node key = it->first;
      const YAML::Node val = it->second;
      std::int64_t v;
      if (key.IsScalar() && as_int(val, v)) out[key.Scalar()] = v;
    }
  } catch (const YAML::Exception&) {
  }
  return out;
}

std::optional<std::string> with_sizes(const std::string& yaml_text, const std::map<std::string, std::int64_t>& values) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap() || !root["sizes"].IsMap()) return std::nullopt;
    YAML::Node sizes = root["sizes"];
    for (const auto& [k, v] : values)
      if (sizes[k].IsDefined() && sizes[k].IsScalar()) sizes[k] = std::to_string(v);
    YAML::Emitter out;
    out << root;
    if (!out.good()) return std::nullopt;
    return std::string(out.c_str()) + "\n";
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

}  // namespace spmd
