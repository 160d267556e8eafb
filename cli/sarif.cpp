// cli/sarif.cpp - SARIF 2.1.0 output: rule metadata from ir/checks.def, one result per diagnostic.
#include "cli/sarif.h"

#include <fmt/format.h>

#include <cctype>

namespace spmd {

namespace {

struct RuleRow {
  const char* name;   // PascalCase (the CheckId enumerator)
  const char* id;     // the stable check ID
  const char* phase;  // spatial, temporal, schedule, autograd
  const char* meaning;
};

constexpr RuleRow kRules[] = {
#define CHECK_ID(Enum, Id, Phase, Meaning) {#Enum, Id, #Phase, Meaning},
#include "ir/checks.def"
#undef CHECK_ID
    {"InvalidInput", "invalid-input", "input", "the file is not a valid program: YAML syntax, an unknown key, op or attribute, a missing key, a bad size"},
};

const char* doc_page(std::string_view phase) {
  if (phase == "schedule") return "docs/schedules.md";
  if (phase == "input") return "docs/format.md";
  return "docs/semantics.md";
}

std::string_view level(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
    case Severity::Note: return "note";
  }
  return "error";
}

int rule_index(std::string_view id) {
  for (std::size_t i = 0; i < std::size(kRules); ++i)
    if (kRules[i].id == id) return static_cast<int>(i);
  return -1;
}

// A relative path or an absolute one as a URI reference (spaces and other unsafe bytes percent-encoded).
std::string uri_of(const std::string& file) {
  std::string u = file.empty() || file[0] != '/' ? "" : "file://";
  for (unsigned char c : file) {
    if (std::isalnum(c) || std::string_view("/-._~").find(static_cast<char>(c)) != std::string_view::npos) u += static_cast<char>(c);
    else u += fmt::format("%{:02X}", c);
  }
  return u;
}

nlohmann::json location(const std::string& file, Loc l) {
  nlohmann::json phys = {{"artifactLocation", {{"uri", uri_of(file)}}}};
  if (l.line) {
    nlohmann::json region = {{"startLine", l.line}};
    if (l.col) region["startColumn"] = l.col;
    phys["region"] = region;
  }
  return {{"physicalLocation", phys}};
}

nlohmann::json result(const std::string& file, std::string_view id, Severity sev, Loc loc, const std::string& message) {
  int idx = rule_index(id);
  return {{"ruleId", std::string(id)}, {"ruleIndex", idx}, {"level", std::string(level(sev))}, {"message", {{"text", message}}},
          {"locations", nlohmann::json::array({location(file, loc)})}};
}

}  // namespace

nlohmann::json sarif_rules() {
  nlohmann::json rules = nlohmann::json::array();
  for (const auto& r : kRules) {
    std::string meaning = r.meaning;
    std::string first = meaning.substr(0, meaning.find(';'));
    rules.push_back({{"id", r.id},
                     {"name", r.name},
                     {"shortDescription", {{"text", first}}},
                     {"fullDescription", {{"text", meaning}}},
                     {"help", {{"text", fmt::format("{} ({} check); see {} for the rule and how to fix it", meaning, r.phase, doc_page(r.phase))}}},
                     {"defaultConfiguration", {{"level", "error"}}},
                     {"properties", {{"tags", {r.phase, "spmd"}}, {"problem.severity", "error"}}}});
  }
  return rules;
}

nlohmann::json render_sarif(const std::vector<SarifFile>& files, const std::string& version) {
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json artifacts = nlohmann::json::array();
  bool ok = true;
  for (const auto& f : files) {
    artifacts.push_back({{"location", {{"uri", uri_of(f.file)}}}});
    if (f.load_error) {
      ok = false;
      results.push_back(result(f.file, "invalid-input", Severity::Error, shown_loc(f.load_error->loc), f.load_error->what()));
      continue;
    }
    if (!f.diags) continue;
    for (const auto& d : *f.diags) {
      nlohmann::json r = result(d.file.empty() ? f.file : d.file, check_name(d.id), d.severity, d.loc, d.message);
      nlohmann::json related = nlohmann::json::array();
      int k = 0;
      for (const auto& n : d.notes) {
        const std::string& nf = n.loc.line ? (n.file.empty() ? f.file : n.file) : (d.file.empty() ? f.file : d.file);
        nlohmann::json l = location(nf, n.loc.line ? n.loc : d.loc);
        l["id"] = k++;
        l["message"] = {{"text", n.message}};
        related.push_back(l);
      }
      if (!related.empty()) r["relatedLocations"] = related;
      nlohmann::json props = nlohmann::json::object();
      if (d.op >= 0) props["op"] = d.op;
      if (!d.tensor.empty()) props["tensor"] = d.tensor;
      if (!d.ranks.empty()) props["ranks"] = d.ranks;
      if (!props.empty()) r["properties"] = props;
      results.push_back(r);
    }
  }
  nlohmann::json driver = {{"name", "spmdcheck"},
                           {"version", version},
                           {"semanticVersion", version},
                           {"rules", sarif_rules()}};
  return {{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
          {"version", "2.1.0"},
          {"runs", nlohmann::json::array({{{"tool", {{"driver", driver}}},
                                           {"invocations", nlohmann::json::array({{{"executionSuccessful", ok}}})},
                                           {"artifacts", artifacts},
                                           {"results", results}}})}};
}

}  // namespace spmd
