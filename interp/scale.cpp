// interp/scale.cpp - rewrites the integer sizes under `sizes:` in place, so every other position is unchanged.
#include "interp/scale.h"

#include <charconv>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/doc.h"

namespace spmd {

namespace {

// An integer entry of `sizes:`: its name, value and the byte range of its digits in the text.
struct SizeEntry {
  std::string name;
  std::int64_t value;
  std::size_t at, len;
};

// The integer entries under `sizes:`, located in `text` by the reader's positions (empty when there are none or
// the text is not a program the reader accepts).
std::vector<SizeEntry> size_entries(const std::string& text) {
  std::vector<SizeEntry> out;
  Doc doc;
  try {
    read_document(text, doc);
  } catch (const LoadError&) {
    return out;
  }
  N root = doc.root();
  if (!root.IsMap()) return out;
  N sizes = root["sizes"];
  if (!sizes.IsMap()) return out;
  std::vector<std::size_t> line_start{0};  // 1-based line -> byte offset
  for (std::size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') line_start.push_back(i + 1);
  for (auto it = sizes.begin(); it != sizes.end(); ++it) {
    N key = *it;
    ++it;
    N val = *it;
    if (!key.IsScalar() || !val.IsScalar() || doc.nodes[val.index()].quoted) continue;
    std::string_view digits = val.sv();
    std::int64_t v = 0;
    auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || v <= 0) continue;
    Loc l = val.loc();
    if (l.line == 0 || l.line > line_start.size()) continue;
    std::size_t at = line_start[l.line - 1] + l.col - 1;
    if (text.compare(at, digits.size(), digits) != 0) continue;  // a position that is not a byte offset: leave it
    out.push_back({key.Scalar(), v, at, digits.size()});
  }
  return out;
}

}  // namespace

std::map<std::string, std::int64_t> named_sizes(const std::string& yaml_text) {
  std::map<std::string, std::int64_t> out;
  for (const auto& e : size_entries(yaml_text)) out[e.name] = e.value;
  return out;
}

std::optional<std::string> with_sizes(const std::string& yaml_text, const std::map<std::string, std::int64_t>& values) {
  auto entries = size_entries(yaml_text);
  if (entries.empty()) return std::nullopt;
  std::string out = yaml_text;
  for (const auto& e : entries) {
    auto it = values.find(e.name);
    if (it == values.end()) continue;
    std::string digits = std::to_string(it->second);
    if (digits.size() > e.len) return std::nullopt;  // only smaller sizes: the text never moves
    digits.resize(e.len, ' ');                       // `H: 8   ` keeps every later column where it was
    out.replace(e.at, e.len, digits);
  }
  return out;
}

}  // namespace spmd
