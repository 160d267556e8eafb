// tests/test_fixes.cpp - every machine-readable fix, applied to the program that has it, must leave a
// program whose finding is gone and that has no new error (docs/format.md, "JSON output").
//
// For every example and test program, `spmdcheck check --format json` runs; each diagnostic's `fix`
// (insert_before, insert_after, replace, append, move) is applied to the file's text, and the result is
// checked again. Strict: the fixed program must not load worse, must not report a check ID the original
// did not, and must have fewer findings of the fixed ID; a program with one finding must become clean.
// A fixed program that passes must also compute the right values: with a `spec:` the value check must not
// find a mismatch, without one the numeric oracle must not see its outputs differ (a fix that hides a bug,
// such as a Wait moved up so that a layer reads the next layer's prefetched weights, passes every type check).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "cli/driver.h"
#include "cli/run.h"
#include "equiv/equiv.h"
#include "ir/loader.h"

namespace {

std::string src(const std::string& rel) { return std::string(SPMD_SOURCE_DIR) + "/" + rel; }

std::string read(const std::string& f) {
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json check_json(const std::string& path) {
  std::ostringstream out, err;
  spmd::run_cli({"check", "--format", "json", path}, out, err);
  auto j = nlohmann::json::parse(out.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("files") || j["files"].empty()) return nlohmann::json::object();
  return j["files"][0];
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> v;
  std::string cur;
  for (char c : s) {
    if (c == '\n') v.push_back(std::move(cur)), cur.clear();
    else cur += c;
  }
  if (!cur.empty()) v.push_back(cur);
  return v;
}

// The indentation of an op item line ("  - {op: ..."), or npos when the line is not one.
std::size_t item_indent(const std::string& line) {
  std::size_t i = line.find_first_not_of(' ');
  if (i == std::string::npos || line.compare(i, 3, "- {") != 0) return std::string::npos;
  return i;
}

// Applies a fix; empty when it cannot be placed (the test then fails: a fix must be applicable).
std::string apply_fix(const std::string& text, const nlohmann::json& fix) {
  std::vector<std::string> lines = split_lines(text);
  std::vector<std::string> ops = split_lines(fix["yaml"].get<std::string>());
  std::string kind = fix["kind"];
  std::size_t line = fix["line"].get<std::size_t>();
  auto items = [&](std::size_t indent) {
    std::vector<std::string> v;
    for (const auto& o : ops) v.push_back(std::string(indent, ' ') + "- " + o);
    return v;
  };
  if (kind == "append") {
    std::string key = fix["section"].get<std::string>() + ":";
    std::size_t at = lines.size();
    for (std::size_t i = 0; i < lines.size(); ++i)
      if (lines[i].rfind(key, 0) == 0) at = i;
    if (at < lines.size() && lines[at].find("[]") != std::string::npos) lines[at] = key;  // `grad_sync: []`
    if (at == lines.size()) {
      lines.push_back(key);
      for (auto& l : items(2)) lines.push_back(l);
    } else {
      std::size_t end = at + 1;
      while (end < lines.size() && (lines[end].empty() || lines[end][0] == ' ' || lines[end][0] == '-')) ++end;
      auto v = items(2);
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(end), v.begin(), v.end());
    }
  } else if (kind == "move") {
    std::size_t from = fix["from_line"].get<std::size_t>();
    if (line == 0 || line > lines.size() || from == 0 || from > lines.size() || item_indent(lines[from - 1]) == std::string::npos) return "";
    std::string moved = lines[from - 1];
    lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(from - 1));
    std::size_t to = from < line ? line - 2 : line - 1;
    lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(to), moved);
  } else {
    if (line == 0 || line > lines.size()) return "";
    std::size_t i = line - 1, ind = item_indent(lines[i]);
    if (ind == std::string::npos) return "";
    auto v = items(ind);
    if (kind == "replace") {
      lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i));
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), v.begin(), v.end());
    } else if (kind == "insert_before") {
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), v.begin(), v.end());
    } else if (kind == "insert_after") {
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i + 1), v.begin(), v.end());
    } else {
      return "";
    }
  }
  std::string out;
  for (const auto& l : lines) {
    // the expectation belongs to the original program
    if (l.rfind("expect:", 0) == 0) continue;
    out += l + "\n";
  }
  return out;
}

// The values of a fixed program that passes: 1 when they agree (the spec's, or the oracle's single-device run),
// 0 when they cannot be compared (skipped), -1 when they differ; `why` says how.
int values_agree(const std::string& text, const std::string& path, std::string& why) {
  spmd::Program p;
  try {
    p = spmd::load_program_string(text, path);
  } catch (const spmd::LoadError& e) {
    why = e.what();
    return -1;
  }
  if (p.has_spec) {
    spmd::EquivResult r = spmd::check_equivalence(p);
    why = r.message;
    return r.verdict == spmd::EquivVerdict::Mismatch ? -1 : r.verdict == spmd::EquivVerdict::Equivalent ? 1 : 0;
  }
  int result = 1;
  for (std::uint64_t seed = 0; seed < 2; ++seed) {
    spmd::RunOptions o;
    o.seed = seed;
    spmd::RunReport r = spmd::run_program_text(text, path, o);
    if (r.oracle.verdict == spmd::OracleVerdict::Differ || r.oracle.verdict == spmd::OracleVerdict::GlobalError) {
      why = r.oracle.message;
      return -1;
    }
    if (r.oracle.verdict != spmd::OracleVerdict::Agree) result = 0, why = r.oracle.message;
  }
  return result;
}

std::map<std::string, int> error_ids(const nlohmann::json& file) {
  std::map<std::string, int> m;
  if (!file.contains("diagnostics")) return m;
  for (const auto& d : file["diagnostics"])
    if (d["severity"] == "error") ++m[d["id"].get<std::string>()];
  return m;
}

}  // namespace

TEST_CASE("fixes: every machine-readable fix, applied, removes its finding and adds none") {
  std::vector<std::string> files;
  for (const char* dir : {"examples", "tests/programs", "docs/tutorial"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(src(dir)))
      if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::filesystem::path tmp = std::filesystem::temp_directory_path() / ("spmd_fixes_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  int applied = 0, clean = 0, agreeing = 0, unjudged = 0;
  for (const auto& f : files) {
    std::string text = read(f);
    if (text.find("csv:") != std::string::npos) continue;  // schedules read files relative to the program
    nlohmann::json orig = check_json(f);
    if (!orig.contains("diagnostics")) continue;
    auto before = error_ids(orig);
    int total = 0;
    for (const auto& [id, n] : before) total += n;
    for (const auto& d : orig["diagnostics"]) {
      if (!d.contains("fix") || d["fix"].is_null()) continue;
      std::string fixed = apply_fix(text, d["fix"]);
      INFO(f << ": " << d["id"] << " at line " << d["line"] << ", fix " << d["fix"].dump());
      REQUIRE_MESSAGE(!fixed.empty(), "the fix cannot be placed");
      std::string path = (tmp / std::filesystem::path(f).filename()).string();
      std::ofstream(path) << fixed;
      nlohmann::json after = check_json(path);
      INFO("fixed program:\n" << fixed << "\nits findings: " << after.dump());
      REQUIRE(after.contains("verdict"));
      CHECK(after["verdict"] != "error");
      auto now = error_ids(after);
      std::string id = d["id"];
      for (const auto& [nid, n] : now) CHECK_MESSAGE(before.count(nid), "a new finding " << nid);
      CHECK_MESSAGE(now[id] < before[id], "the finding is still there");
      if (total == 1) CHECK_MESSAGE(after["verdict"] == "pass", "the only finding is fixed, but the program does not pass");
      ++applied;
      clean += after["verdict"] == "pass";
      if (after["verdict"] == "pass") {
        std::string why;
        int v = values_agree(fixed, path, why);
        CHECK_MESSAGE(v >= 0, "the fixed program passes every check, but its values are wrong: " << why);
        agreeing += v > 0;
        unjudged += v == 0;
      }
    }
  }
  std::filesystem::remove_all(tmp);
  MESSAGE(applied << " fixes applied, " << clean << " of them leave a program that passes; of those, " << agreeing
                  << " compute the spec's (or the single-device) values and " << unjudged << " cannot be compared");
  CHECK(applied >= 10);
}
