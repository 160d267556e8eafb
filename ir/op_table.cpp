// ir/op_table.cpp - builds the op table from ir/ops.def and renders it.
#include "ir/op_table.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace spmd {

namespace {

std::vector<AttrSpec> parse_attr_specs(std::string_view text) {
  std::vector<AttrSpec> out;
  std::istringstream in{std::string(text)};
  std::string tok;
  while (in >> tok) {
    AttrSpec a;
    if (!tok.empty() && tok.back() == '!') {
      a.required = true;
      tok.pop_back();
    }
    auto colon = tok.find(':');
    if (colon == std::string::npos) throw std::logic_error("ops.def: attribute without type: " + tok);
    a.name = tok.substr(0, colon);
    std::string type = tok.substr(colon + 1);
    static const std::unordered_map<std::string, AttrType> types = {
        {"axes", AttrType::Axes},     {"int", AttrType::Int},         {"ints", AttrType::Ints},
        {"number", AttrType::Number}, {"bool", AttrType::Bool},       {"placement", AttrType::Placement},
        {"placements", AttrType::Placements}, {"reduce", AttrType::Reduce}, {"dtype", AttrType::DType},
        {"shape", AttrType::Shape},   {"name", AttrType::Name},       {"names", AttrType::Names},
        {"coords", AttrType::Coords}, {"size", AttrType::Size}};
    if (type.rfind("enum(", 0) == 0 && type.back() == ')') {
      a.type = AttrType::Enum;
      std::string body = type.substr(5, type.size() - 6);
      std::size_t start = 0;
      for (;;) {
        auto bar = body.find('|', start);
        a.choices.push_back(body.substr(start, bar - start));
        if (bar == std::string::npos) break;
        start = bar + 1;
      }
    } else {
      auto it = types.find(type);
      if (it == types.end()) throw std::logic_error("ops.def: unknown attribute type: " + type);
      a.type = it->second;
    }
    out.push_back(std::move(a));
  }
  out.push_back({"stream", AttrType::Name, false, {}});
  out.push_back({"at", AttrType::Name, false, {}});
  return out;
}

std::vector<OpInfo> build_table() {
  std::vector<OpInfo> t;
#define OP(Name, Cat, MinIn, MaxIn, MinOut, MaxOut, Attrs, Operands, Meaning) \
  t.push_back({OpKind::Name, #Name, OpCategory::Cat, MinIn, MaxIn, MinOut, MaxOut, Attrs, Operands, Meaning, parse_attr_specs(Attrs)});
#include "ir/ops.def"
#undef OP
  return t;
}

const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> t = build_table();
  return t;
}

constexpr std::string_view kCheckNames[] = {
#define CHECK_ID(Enum, Id, Phase, Meaning) Id,
#include "ir/checks.def"
#undef CHECK_ID
};

std::string arity(int lo, int hi) {
  if (lo == hi) return std::to_string(lo);
  return std::to_string(lo) + "-" + std::to_string(hi);
}

}  // namespace

const AttrSpec* OpInfo::find_attr(std::string_view n) const {
  for (const auto& a : attrs)
    if (a.name == n) return &a;
  return nullptr;
}

const OpInfo& op_info(OpKind k) { return table()[static_cast<std::size_t>(k)]; }
std::span<const OpInfo> all_ops() { return table(); }
std::string_view op_name(OpKind k) { return op_info(k).name; }

std::optional<OpKind> op_by_name(std::string_view name) {
  static const auto index = [] {
    std::unordered_map<std::string_view, OpKind> m;
    for (const auto& info : table()) m.emplace(info.name, info.kind);
    // Aliases from the contract: the async spellings name the same ops.
    m.emplace("AllReduceAsync", OpKind::AllReduce);
    m.emplace("AllGatherAsync", OpKind::AllGather);
    m.emplace("ReduceScatterAsync", OpKind::ReduceScatter);
    m.emplace("SendAsync", OpKind::Send);
    m.emplace("RecvAsync", OpKind::Recv);
    return m;
  }();
  auto it = index.find(name);
  if (it == index.end()) return std::nullopt;
  return it->second;
}

std::string_view category_name(OpCategory c) {
  switch (c) {
    case OpCategory::compute: return "compute";
    case OpCategory::gradient: return "gradient";
    case OpCategory::collective: return "collective";
    case OpCategory::p2p: return "point-to-point";
    case OpCategory::async: return "async";
    case OpCategory::precision: return "precision";
    case OpCategory::shape: return "shape";
    case OpCategory::spmd: return "spmd";
    case OpCategory::optimizer: return "optimizer";
    case OpCategory::later: return "not supported yet";
  }
  return "?";
}

std::string attr_type_name(const AttrSpec& a) {
  switch (a.type) {
    case AttrType::Axes: return "axis name or list";
    case AttrType::Int: return "int";
    case AttrType::Ints: return "int or list of ints";
    case AttrType::Number: return "number";
    case AttrType::Bool: return "bool";
    case AttrType::Placement: return "placement";
    case AttrType::Placements: return "placement map";
    case AttrType::Reduce: return "sum|avg|max|min";
    case AttrType::DType: return "dtype";
    case AttrType::Shape: return "shape";
    case AttrType::Name: return "name";
    case AttrType::Names: return "list of names";
    case AttrType::Coords: return "coordinates";
    case AttrType::Size: return "size expression";
    case AttrType::Enum: {
      std::string s;
      for (const auto& c : a.choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
  }
  return "?";
}

std::string_view check_name(CheckId id) { return kCheckNames[static_cast<std::size_t>(id)]; }

std::optional<CheckId> check_by_name(std::string_view name) {
  for (std::size_t i = 0; i < std::size(kCheckNames); ++i)
    if (kCheckNames[i] == name) return static_cast<CheckId>(i);
  return std::nullopt;
}

std::vector<std::string_view> all_check_names() { return {std::begin(kCheckNames), std::end(kCheckNames)}; }

std::optional<std::string> did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  std::optional<std::string> best;
  std::size_t best_d = std::string::npos;
  if (word.size() > 64) return std::nullopt;  // a typo is short; long names would make this quadratic
  for (const auto& cand : candidates) {
    if (cand.size() > 64) continue;
    // Optimal-string-alignment distance (a swap of two neighbours counts once), case-insensitive.
    std::vector<std::vector<std::size_t>> t(word.size() + 1, std::vector<std::size_t>(cand.size() + 1));
    for (std::size_t i = 0; i <= word.size(); ++i) t[i][0] = i;
    for (std::size_t j = 0; j <= cand.size(); ++j) t[0][j] = j;
    for (std::size_t i = 1; i <= word.size(); ++i)
      for (std::size_t j = 1; j <= cand.size(); ++j) {
        std::size_t cost = lower(word[i - 1]) == lower(cand[j - 1]) ? 0 : 1;
        t[i][j] = std::min({t[i - 1][j] + 1, t[i][j - 1] + 1, t[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && lower(word[i - 1]) == lower(cand[j - 2]) && lower(word[i - 2]) == lower(cand[j - 1]))
          t[i][j] = std::min(t[i][j], t[i - 2][j - 2] + 1);
      }
    std::size_t d = t[word.size()][cand.size()];
    if (d < best_d) {
      best_d = d;
      best = cand;
    }
  }
  std::size_t limit = std::max<std::size_t>(1, std::min(word.size(), best ? best->size() : 0) / 3 + 1);
  if (best && best_d <= limit) return best;
  return std::nullopt;
}

std::string ops_markdown() {
  std::ostringstream o;
  o << "# Ops\n\nGenerated from `ir/ops.def` by `spmdcheck ops --markdown`; do not edit by hand "
       "(a test fails when this file is stale).\n\n"
       "Every op also takes `stream: NAME` and `at: ORIGIN` (an imported op's source line, docs/import.md). Attributes marked **required** must be given. "
       "Ops in the category *not supported yet* are recognized and rejected with a located error.\n";
  OpCategory last = OpCategory::later;
  bool first = true;
  for (const auto& info : table()) {
    if (first || info.category != last) {
      o << "\n## " << category_name(info.category) << "\n\n| op | inputs | outputs | attributes | meaning |\n| --- | --- | --- | --- | --- |\n";
      last = info.category;
      first = false;
    }
    std::string attrs;
    for (const auto& a : info.attrs) {
      if (a.name == "stream" || a.name == "at") continue;
      attrs += (attrs.empty() ? "" : ", ") + std::string("`") + a.name + "` (" + attr_type_name(a) + (a.required ? ", required" : "") + ")";
    }
    std::string operands(info.operands);
    for (auto& c : operands)
      if (c == '|') c = '/';
    o << "| " << info.name << " | " << arity(info.min_in, info.max_in) << ": " << operands << " | "
      << arity(info.min_out, info.max_out) << " | " << (attrs.empty() ? "-" : attrs) << " | " << info.meaning << " |\n";
  }
  o << "\n## Check IDs\n\n| id | meaning |\n| --- | --- |\n";
#define CHECK_ID(Enum, Id, Phase, Meaning) o << "| " << Id << " | " << Meaning << " |\n";
#include "ir/checks.def"
#undef CHECK_ID
  return o.str();
}

std::string ops_text() {
  std::ostringstream o;
  for (const auto& info : table()) {
    o << info.name << "  [" << category_name(info.category) << "]\n    in: " << arity(info.min_in, info.max_in) << " ("
      << info.operands << "), out: " << arity(info.min_out, info.max_out) << "\n";
    std::string attrs;
    for (const auto& a : info.attrs) {
      if (a.name == "stream" || a.name == "at") continue;
      attrs += (attrs.empty() ? "" : ", ") + a.name + (a.required ? "!" : "") + ": " + attr_type_name(a);
    }
    if (!attrs.empty()) o << "    attrs: " << attrs << "\n";
    o << "    " << info.meaning << "\n";
  }
  return o.str();
}

}  // namespace spmd
