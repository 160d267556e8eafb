// tests/test_cli.cpp - exit codes, JSON output, `spmdcheck test`, and the generated docs/ops.md.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <algorithm>
#include <set>

#include "cli/driver.h"
#include "ir/loader.h"
#include "ir/op_table.h"
#include "schedules/schedule.h"
#include "spatial/spatial.h"

#include "tests/helpers.h"

using namespace spmd;

namespace {

using test::Run;
using test::run;

std::string src(const std::string& rel) { return std::string(SPMD_SOURCE_DIR) + "/" + rel; }

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = std::string(SPMD_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("loss-scaling's LossScale fix names every axis the loss is a per-rank mean over") {
  // the MoE loss is a per-rank mean over dp and ep; LossScale must list both, or applying the fix is loss-scaling again
  Run r = run({"check", src("examples/moe/deepseek_v3_moe_train_expert_grad_scale.yaml")});
  CHECK(r.code == 1);
  CHECK(r.out.find("error[loss-scaling]") != std::string::npos);
  CHECK(r.out.find("axis: [dp, ep]} after the op that produces loss") != std::string::npos);
}

TEST_CASE("exit codes: 0 clean, 1 findings, 2 bad input") {
  CHECK(run({"check", src("examples/tp/mlp.yaml")}).code == 0);
  Run bad = run({"check", src("examples/tp/mlp_bias_before_allreduce.yaml")});
  CHECK(bad.code == 1);
  CHECK(bad.out.find("error[partial-misuse]") != std::string::npos);
  CHECK(bad.out.find("note: fix:") != std::string::npos);
  Run unreadable = run({"check", src("no/such/file.yaml")});
  CHECK(unreadable.code == 2);
  CHECK(unreadable.out.find("cannot open file") != std::string::npos);
  std::string broken = write_tmp("broken.yaml", "mesh: {tp: 2}\nops:\n  - {op: Matmul}\n");
  Run b = run({"check", broken});
  CHECK(b.code == 2);
  CHECK(b.out.find("broken.yaml:3:10: error: unknown op 'Matmul'; did you mean 'MatMul'?") != std::string::npos);
  CHECK(run({"frobnicate"}).code == 2);
  CHECK(run({"check"}).code == 2);
}

TEST_CASE("JSON output follows the contract") {
  Run r = run({"check", "--format", "json", src("examples/tp/mlp_bias_before_allreduce.yaml"), src("examples/tp/mlp.yaml")});
  CHECK(r.code == 1);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["files"].size() == 2);
  CHECK(j["files"][0]["verdict"] == "fail");
  CHECK(j["files"][1]["verdict"] == "pass");
  auto d = j["files"][0]["diagnostics"][0];
  CHECK(d["id"] == "partial-misuse");
  CHECK(d["severity"] == "error");
  CHECK(d["line"].get<int>() > 0);
  CHECK(d["op"].is_number());
  CHECK(d["tensor"] == "y_partial");
  CHECK(d["ranks"].is_array());
  CHECK(d["notes"].size() >= 2);
  CHECK(d["fix"].is_null());  // text-only fix
  std::string broken = write_tmp("broken2.yaml", "mesh: [\n");
  auto e = nlohmann::json::parse(run({"check", "--format", "json", broken}).out);
  CHECK(e["files"][0]["verdict"] == "error");
  CHECK(e["files"][0]["diagnostics"][0]["fix"].is_null());
}

TEST_CASE("JSON output: machine-readable fixes") {
  auto first = [](const std::string& f) {
    return nlohmann::json::parse(run({"check", "--format", "json", src(f)}).out)["files"][0]["diagnostics"][0]["fix"];
  };
  auto scatter = first("tests/programs/fixes/scatter_wrong_dim_bad.yaml");
  CHECK(scatter["kind"] == "replace");
  CHECK(scatter["line"] == 11);
  CHECK(scatter["op_index"] == 1);
  CHECK(scatter["yaml"] == "{op: ReduceScatter, in: [o_partial], out: o, axis: tp, dim: 1}");
  auto amax = first("tests/programs/fixes/amax_two_axes_bad.yaml");
  CHECK(amax["kind"] == "append");
  CHECK(amax["section"] == "ops");
  CHECK(amax["yaml"] == "{op: AllReduce, in: [amax], out: amax, axis: [dp, tp], reduce: max}");
  auto sync = first("tests/programs/autograd/unsynced_dp_bad.yaml");
  CHECK(sync["kind"] == "append");
  CHECK(sync["section"] == "grad_sync");
  CHECK(sync["yaml"] == "{op: AllReduce, in: [w.grad], out: w.grad, axis: dp}");
  auto wait = first("examples/temporal/tp_overlap_wrong_handle.yaml");
  CHECK(wait["kind"] == "move");
  CHECK(wait["yaml"] == "{op: Wait, handle: ag}");
  CHECK(wait["from_line"] == 20);
  CHECK(wait["line"] == 19);
}

TEST_CASE("spmdcheck test: closing line and failures") {
  Run r = run({"test", src("examples/tp")});
  CHECK(r.code == 0);
  CHECK(r.out.find(" passed, 0 failed\n") != std::string::npos);
  std::string wrong = write_tmp("wrong_expect.yaml", "mesh: {tp: 2}\ntensors:\n  x: {shape: [4], placement: {tp: P}}\nops:\n"
                                                      "  - {op: GELU, in: [x], out: y}\nexpect: []\n");
  Run w = run({"test", wrong});
  CHECK(w.code == 1);
  CHECK(w.out.find("0 passed, 1 failed") != std::string::npos);
  CHECK(w.out.find("expected [] but got [partial-misuse]") != std::string::npos);
}

TEST_CASE("docs/ops.md is generated from the op table and up to date") {
  std::ifstream in(src("docs/ops.md"));
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK_MESSAGE(ss.str() == ops_markdown(), "docs/ops.md is stale: run `spmdcheck ops --markdown > docs/ops.md`");
  Run r = run({"ops"});
  CHECK(r.code == 0);
  CHECK(r.out.find("AllReduce") != std::string::npos);
}

TEST_CASE("--dump-hb writes the happens-before graph; an unwritable path is an input error") {
  std::string dot = std::string(SPMD_BINARY_DIR) + "/hb.dot";
  Run r = run({"check", "--dump-hb", dot, src("examples/temporal/tp_overlap.yaml")});
  CHECK(r.code == 0);
  std::ifstream in(dot);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str().rfind("digraph hb {", 0) == 0);
  CHECK(ss.str().find("stream comm") != std::string::npos);
  Run bad = run({"check", "--dump-hb", "/nonexistent/dir/hb.dot", src("examples/temporal/tp_overlap.yaml")});
  CHECK(bad.code == 2);
  CHECK(bad.out.find("cannot write") != std::string::npos);
}

TEST_CASE("unbounded inputs: devices are refused with exit 2, for programs and schedule CSVs") {
  Run z = run({"check", "/dev/zero"});
  CHECK(z.code == 2);
  CHECK(z.out.find("/dev/zero:1:1: error: '/dev/zero' is not a regular file") != std::string::npos);
  std::string csv = write_tmp("csv_dev_zero.yaml", "mesh: {pp: 2}\nschedule: {csv: /dev/zero, axis: pp}\n");
  Run c = run({"check", csv});
  CHECK(c.code == 2);
  CHECK(c.out.find("csv_dev_zero.yaml:2:") != std::string::npos);
  CHECK(c.out.find("not a regular file") != std::string::npos);
}

TEST_CASE("a finding inside a module names the instance") {
  Run r = run({"check", src("tests/programs/modules/repeat_mlp_missing_allreduce.yaml")});
  CHECK(r.code == 1);
  CHECK(r.out.find("repeat_mlp_missing_allreduce.yaml:24:9: error[partial-misuse]") != std::string::npos);
  CHECK(r.out.find("26:5: note: in layer 0 of 4 ('mlp.0', module mlp, numbered from 0), expanded here") != std::string::npos);
}

TEST_CASE("robustness: invalid UTF-8 echoed in JSON, oversized schedules and CSVs are located errors (exit 2)") {
  // A YAML file that is not UTF-8 is a located load error (libyaml checks the encoding), in valid JSON.
  std::string bad_utf8 = write_tmp("bad_utf8.yaml", "mesh: {dp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: GELU, in: [x\xff\xfe], out: y}\n");
  Run y = run({"check", "--format", "json", bad_utf8});
  CHECK(y.code == 2);
  CHECK(y.out.find("\"id\": \"invalid-input\"") != std::string::npos);
  CHECK(y.out.find("\"line\": 5") != std::string::npos);
  CHECK(y.out.find("\"column\": 22") != std::string::npos);
  CHECK(y.out.find("must be UTF-8") != std::string::npos);
  // A message that echoes bytes that are not UTF-8 (a schedule CSV's cell; a program must be UTF-8, JSON too)
  // still prints valid JSON: they become U+FFFD.
  std::string bad_csv = write_tmp("bad_utf8.csv", "0F0,0\xff\xfe\n");
  Run j = run({"check", "--format", "json", bad_csv});
  CHECK(j.code == 2);
  CHECK(j.out.find("\"id\": \"invalid-input\"") != std::string::npos);
  CHECK(j.out.find("\xef\xbf\xbd") != std::string::npos);
  std::string bad_key = write_tmp("bad_utf8_key.yaml", "mesh: {dp: 2}\nops: []\nx\xff: 1\n");
  Run k = run({"check", "--format", "json", bad_key});
  CHECK(k.code == 2);
  CHECK(k.out.find("\"files\"") != std::string::npos);
  // Schedules: bounded before anything is allocated.
  Run g = run({"schedule", "gen", "--kind", "Interleaved1F1B", "--stages", "4096", "--microbatches", "1048576", "--virtual", "64"});
  CHECK(g.code == 2);
  CHECK(g.err.find("more than the 500000 a schedule may have") != std::string::npos);
  std::string big = write_tmp("schedule_1m.yaml", "mesh: {pp: 4}\nschedule: {kind: 1F1B, microbatches: 1048576}\n");
  Run s = run({"check", "--format", "json", big});
  CHECK(s.code == 2);
  CHECK(s.out.find("\"line\": 2") != std::string::npos);
  std::string rows;
  for (int r = 0; r < 4097; ++r) rows += "0F0\n";
  Run c = run({"check", "--format", "json", write_tmp("rows.csv", rows)});
  CHECK(c.code == 2);
  CHECK(c.out.find("the schedule has 4097 rows (pipeline ranks); at most 4096 are supported") != std::string::npos);
  CHECK(c.out.find("\"line\": 4097") != std::string::npos);
}

// ---- explain, report, schema, SARIF and the CLI conventions (issue 13) ---------------------------

namespace {

Run run_stdin(const std::vector<std::string>& args, const std::string& input) {
  std::ostringstream out, err;
  std::istringstream in(input);
  int code = run_cli(args, out, err, in);
  return {code, out.str(), err.str()};
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("--version prints the version and exits 0") {
  Run r = run({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out.rfind("spmdcheck ", 0) == 0);
}

TEST_CASE("- reads the program from standard input") {
  std::string text = slurp(src("docs/tutorial/02_tp_mlp_bias_bug.yaml"));
  Run r = run_stdin({"check", "-"}, text);
  CHECK(r.code == 1);
  CHECK(r.out.find("<stdin>:17:5: error[partial-misuse]") != std::string::npos);
  CHECK(run_stdin({"check", "-"}, slurp(src("docs/tutorial/03_tp_mlp.yaml"))).code == 0);
  Run bad = run_stdin({"check", "-"}, "mesh: {tp: 2}\nops:\n  - {op: Matmul}\n");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("<stdin>:3:10: error: unknown op 'Matmul'") != std::string::npos);
  Run e = run_stdin({"explain", "-", "--tensor", "z"}, text);
  CHECK(e.out.find("P(sum) of:") != std::string::npos);
  CHECK(run_stdin({"test", "-"}, text).code == 0);  // its expect: [partial-misuse] holds
}

TEST_CASE("--color: always colours diagnostics and pictures, never and auto (not a terminal) do not") {
  std::string f = src("docs/tutorial/02_tp_mlp_bias_bug.yaml");
  CHECK(run({"check", "--color", "always", f}).out.find("\x1b[1;31merror[partial-misuse]") != std::string::npos);
  CHECK(run({"--color", "always", "check", f}).out.find("\x1b[") != std::string::npos);
  CHECK(run({"check", "--color", "never", f}).out.find('\x1b') == std::string::npos);
  CHECK(run({"check", f}).out.find('\x1b') == std::string::npos);
  CHECK(run({"explain", "--color", "always", "--tensor", "h", f}).out.find("\x1b[48;5;") != std::string::npos);
  CHECK(run({"check", "--color", "sometimes", f}).code == 2);
}

TEST_CASE("explain: shapes, placements per axis, local shapes and the chain of why") {
  Run r = run({"explain", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(r.code == 1);  // the program has an error, shown under its op
  CHECK(r.out.find("w1    [1024, 4096] f32  tp: S(1)  local [1024, 1024]") != std::string::npos);
  CHECK(r.out.find("why tp P(sum): z became P(sum) at MatMul (line 16) from a S(2), w2 S(0): MatMul contracts a dim sharded S(2) x S(0) over tp") !=
        std::string::npos);
  CHECK(r.out.find("a S(2) via GELU (line 15) <- h became S(2) at MatMul (line 14)") != std::string::npos);
  CHECK(r.out.find("error[partial-misuse]") != std::string::npos);
  Run op = run({"explain", "--op", "2", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(op.out.find("op 2 (line 16): MatMul(a, w2) -> z") != std::string::npos);
  CHECK(op.out.find("inputs:") != std::string::npos);
  CHECK(op.out.find("op 1 ") == std::string::npos);
  CHECK(run({"explain", "--op", "9", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")}).code == 2);
  Run typo = run({"explain", "--tensor", "w3", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(typo.code == 2);
  CHECK(typo.err.find("did you mean") != std::string::npos);
  // Symbolic sizes: the local shape is an expression.
  Run sym = run({"explain", src("docs/tutorial/08_sp_mlp_sym.yaml")});
  CHECK(sym.code == 0);
  CHECK(sym.out.find("/T") != std::string::npos);
}

TEST_CASE("explain --tensor draws the layout: shards as a grid, R as one block, P as stacked summands") {
  Run h = run({"explain", "--tensor", "h", src("docs/tutorial/06_sp_mlp.yaml")});
  CHECK(h.code == 0);
  CHECK(h.out.find("columns: dim 2 (4096) split 4 ways over tp") != std::string::npos);
  CHECK(h.out.find("rows: dim 0 (8) split 2 ways over dp") != std::string::npos);
  CHECK(h.out.find("| dp1 tp3 ") != std::string::npos);
  Run z = run({"explain", "--tensor", "z", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(z.out.find("| + tp3") != std::string::npos);
  Run x = run({"explain", "--tensor", "x", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(x.out.find("| all 4 ranks |") != std::string::npos);
}

TEST_CASE("the origin record costs nothing unless asked for") {
  Program p = load_program_file(src("docs/tutorial/03_tp_mlp.yaml"));
  SpatialTypes t;
  SpatialOptions so;
  so.types = &t;
  check_spatial(p, so);
  CHECK(t.decl_origins.empty());
  CHECK(t.out_origins.empty());
  t.want_origins = true;
  check_spatial(p, so);
  CHECK(t.decl_origins.size() == t.decls.size());
  CHECK(t.out_origins.size() == t.outs.size());
}

TEST_CASE("report writes one self-contained page") {
  std::string out = std::string(SPMD_BINARY_DIR) + "/report_unit.html";
  Run r = run({"report", src("examples/temporal/ring_send_first.yaml"), "-o", out});
  CHECK(r.code == 1);
  std::string html = slurp(out);
  CHECK(html.find("<!DOCTYPE html>") == 0);
  CHECK(html.find("id=\"timeline\"") != std::string::npos);
  CHECK(html.find("p2p-op blocked\"") != std::string::npos);
  CHECK(html.find("class=\"cycle\"") != std::string::npos);
  CHECK(html.find("data-id=\"deadlock\"") != std::string::npos);
  CHECK(html.find("src=\"http") == std::string::npos);  // nothing loaded from elsewhere (the SVG namespace is only a name)
  CHECK(html.find("href=\"http") == std::string::npos);
  Run s = run({"report", src("examples/pipeline/1f1b_4stages.yaml"), "-o", "-"});
  CHECK(s.out.find("table class=\"pipeline\"") != std::string::npos);
  Run bad = run({"report", src("tests/bad_input/op_unknown_did_you_mean.yaml"), "-o", "-"});
  CHECK(bad.code == 2);
  CHECK(bad.out.find("data-id=\"invalid-input\"") != std::string::npos);
}

TEST_CASE("schema and SARIF are JSON with every op and every check ID") {
  Run s = run({"schema"});
  REQUIRE(s.code == 0);
  auto j = nlohmann::json::parse(s.out);
  auto ops = j["definitions"]["op"]["properties"]["op"]["enum"];
  CHECK(std::find(ops.begin(), ops.end(), "MatMul") != ops.end());
  CHECK(std::find(ops.begin(), ops.end(), "MoEDispatch") != ops.end());  // the MoE ops are real ops (issue 10)
  Run r = run({"check", "--format", "sarif", src("docs/tutorial/02_tp_mlp_bias_bug.yaml")});
  CHECK(r.code == 1);
  auto log = nlohmann::json::parse(r.out);
  CHECK(log["version"] == "2.1.0");
  auto rules = log["runs"][0]["tool"]["driver"]["rules"];
  for (auto id : all_check_names())
    CHECK(std::any_of(rules.begin(), rules.end(), [&](const nlohmann::json& x) { return x["id"] == std::string(id); }));
  auto res = log["runs"][0]["results"][0];
  CHECK(res["ruleId"] == "partial-misuse");
  CHECK(res["locations"][0]["physicalLocation"]["region"]["startLine"] == 17);
  CHECK(res["relatedLocations"].size() >= 1);
}

TEST_CASE("test: a file with no expect: must produce nothing (docs/format.md)") {
  std::string clean = write_tmp("no_expect_clean.yaml", "mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nops:\n  - {op: ReLU, in: [x], out: y}\n");
  Run a = run({"test", clean});
  CHECK(a.code == 0);
  CHECK(a.out.find("PASS") != std::string::npos);
  std::string dirty = write_tmp("no_expect_dirty.yaml", "mesh: {tp: 2}\ntensors: {x: {shape: [4], placement: {tp: P}}}\nops:\n  - {op: ReLU, in: [x], out: y}\n");
  Run b = run({"test", dirty});
  CHECK(b.code == 1);
  CHECK(b.out.find("no `expect:`") != std::string::npos);
}

TEST_CASE("the explain outputs shown in the docs are what explain prints") {
  // Each "$ spmdcheck explain ..." block of these pages must match the command's output; a line "..." skips lines.
  namespace fs = std::filesystem;
  fs::path old = fs::current_path();
  fs::current_path(SPMD_SOURCE_DIR);  // the docs run commands from the repository root
  int blocks = 0;
  for (const char* doc : {"README.md", "docs/tutorial.md", "docs/coming-from.md"}) {
    std::istringstream text(slurp(doc));
    std::vector<std::string> lines;
    for (std::string l; std::getline(text, l);) lines.push_back(l);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("$ spmdcheck explain ", 0) != 0) continue;
      std::vector<std::string> args;
      std::istringstream cmd(lines[i].substr(12));
      for (std::string a; cmd >> a;) args.push_back(a);
      std::vector<std::string> want;
      for (std::size_t k = i + 1; k < lines.size() && lines[k].rfind("```", 0) != 0; ++k) want.push_back(lines[k]);
      Run r = run(args);
      std::istringstream got_text(r.out);
      std::vector<std::string> got;
      for (std::string l; std::getline(got_text, l);) got.push_back(l);
      // Match `want` against `got` in order; "..." matches any run of lines.
      std::size_t g = 0;
      bool ok = true, skip = false;
      std::string missing;
      for (const auto& w : want) {
        if (w.find_first_not_of(' ') != std::string::npos && w.substr(w.find_first_not_of(' ')) == "...") {
          skip = true;
          continue;
        }
        while (skip && g < got.size() && got[g] != w) ++g;
        if (g >= got.size() || got[g] != w) {
          ok = false;
          missing = w;
          break;
        }
        ++g;
        skip = false;
      }
      INFO(doc << ": " << lines[i] << "\nfirst line not printed as shown: " << missing << "\noutput:\n" << r.out);
      CHECK(ok);
      ++blocks;
    }
  }
  fs::current_path(old);
  CHECK(blocks >= 5);
}

// ---- the learner's view and a repository that stands alone (issue 23) ------------------------------

TEST_CASE("explain --tensor draws what each rank holds: a strided shard in its order, a zigzag sequence chunk by chunk") {
  // FSDP2 + TP: w2's dim 0 is cut tp-major (order: [tp, dp]), so rows 8:16 are dp1 tp0's, not dp0 tp1's.
  Run w2 = run({"explain", "--tensor", "w2", src("examples/fsdp/fsdp2_tp_dp_outer.yaml")});
  CHECK(w2.out.find("w2: [32, 16] f32  dp: S(0), tp: S(0), order: [tp, dp]\n") != std::string::npos);
  CHECK(w2.out.find("rows: dim 0 (32) split 4 ways over tp x dp (tp major: a strided shard, not mesh order)") != std::string::npos);
  CHECK(w2.out.find(" 8:16 | dp1 tp0 |") != std::string::npos);
  CHECK(w2.out.find("16:24 | dp0 tp1 |") != std::string::npos);
  // Mesh order is unchanged: dp major.
  Run h = run({"explain", "--tensor", "h", src("docs/tutorial/06_sp_mlp.yaml")});
  CHECK(h.out.find("4:8 | dp1 tp0 ") != std::string::npos);
  // Zigzag over cp = 4 (LoadBalance, then S(1)): rank i holds chunks i and 7-i of 8.
  Run xs = run({"explain", "--tensor", "xs", src("examples/cp/llama3_cp_allgather_kv_zigzag.yaml")});
  CHECK(xs.out.find("cp: S(1)  dim 1 in zigzag order over cp") != std::string::npos);
  CHECK(xs.out.find("   0:1024 | cp0 |") != std::string::npos);
  CHECK(xs.out.find("4096:5120 | cp3 |") != std::string::npos);
  CHECK(xs.out.find("7168:8192 | cp0 |") != std::string::npos);
  // Not sharded but in zigzag order: the note gives the order of the chunks.
  Run kf = run({"explain", "--tensor", "k_full", src("examples/cp/llama3_cp_allgather_kv_zigzag.yaml")});
  CHECK(kf.out.find("its 8 chunks lie in the order 0, 7, 1, 6, 2, 5, 3, 4") != std::string::npos);
  // A grid wider than 100 characters leaves out middle columns (it was 221 characters here).
  Run wide = run({"explain", "--tensor", "h", src("examples/moe/deepseek_v3_moe_train.yaml")});
  std::istringstream lines(wide.out);
  std::size_t widest = 0;
  for (std::string l; std::getline(lines, l);)
    if (l.find("+---") != std::string::npos || l.find(" | ") != std::string::npos) widest = std::max(widest, l.size());
  CHECK(widest <= 100);
  CHECK(wide.out.find("0:1 | dp0 ep0 tp0 | dp0 ep1 tp0 |") != std::string::npos);
  CHECK(wide.out.find("| ... | dp0 ep7 tp0 |") != std::string::npos);
  CHECK(wide.out.find("column blocks 5 to 6 (of 0 to 7) are left out") != std::string::npos);
}

TEST_CASE("a placement is printed with its shard order everywhere: explain, why, and the placement-mismatch message") {
  Run e = run({"explain", src("examples/fsdp/fsdp2_tp_dp_outer.yaml")});
  CHECK(e.out.find("w2          [32, 16] f32  dp: S(0), tp: S(0), order: [tp, dp]  local [8, 16]") != std::string::npos);
  CHECK(e.out.find("why tp S(0) (order [tp, dp]): w2 declared S(0) (order [tp, dp]) at line 14") != std::string::npos);
  CHECK(e.out.find("w2_tp became S(0) at ZeROGatherParam (line 19) from w2 S(0) (order [tp, dp])") != std::string::npos);
  Run c = run({"check", src("tests/programs/zero/order_output_bad.yaml")});
  CHECK(c.code == 1);
  CHECK(c.out.find("error[placement-mismatch]: output y is {dp: S(0), tp: S(0), order: [tp, dp]}, but it is declared {dp: S(0), tp: S(0)}: the same "
                   "axes cut dim 0 in another order") != std::string::npos);
}

TEST_CASE("the deadlock grid stops every rank the notes call blocked, and a wide grid is folded") {
  // Rendezvous 1F1B: ranks 2 and 3 form the cycle, ranks 0 and 1 are also blocked; all four rows stop.
  Run r = run({"check", src("examples/pipeline/1f1b_4stages_rendezvous.yaml")});
  CHECK(r.code == 1);
  CHECK(r.out.find("  rank 0 | 0F0   0F1   0F2   >0F3<  (blocked)\n") != std::string::npos);
  CHECK(r.out.find("  rank 1 | 1F0   1F1   >1F2<  (blocked)\n") != std::string::npos);
  CHECK(r.out.find("0B0") == std::string::npos);  // nothing after a blocked cell
  // The 8-rank interleaved schedule (a hundred steps) is folded into bands of at most 100 columns.
  Run s = run({"schedule", "show", src("tests/data/pipelining/torchtitan_interleaved1f1b_8ranks_16mb.csv")});
  CHECK(s.code == 0);
  std::istringstream lines(s.out);
  int bands = 0;
  std::size_t widest = 0;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("    step |", 0) == 0) ++bands;
    if (l.find(" | ") != std::string::npos) widest = std::max(widest, l.size());
  }
  CHECK(bands > 10);
  CHECK(widest <= 100);
}

TEST_CASE("report: the line under the title names what the file is, also for a schedule CSV") {
  Run csv = run({"report", src("tests/data/pipelining/torchtitan_2rank.csv"), "-o", "-"});
  CHECK(csv.out.find("<div class=\"meta\">pipeline schedule: 2 ranks, 4 stages, ") != std::string::npos);
  CHECK(csv.out.find("<div class=\"meta\"> &middot;") == std::string::npos);
  Run yaml = run({"report", src("docs/tutorial/02_tp_mlp_bias_bug.yaml"), "-o", "-"});
  CHECK(yaml.out.find("<div class=\"meta\">") != std::string::npos);
  CHECK(yaml.out.find("mesh {tp: 4} &middot; 4 ops &middot; spmdcheck ") != std::string::npos);
}

TEST_CASE("the repository stands alone: no test or example reads ../shared, run-example builds one binary, the README's table") {
  namespace fs = std::filesystem;
  for (const char* dir : {"examples", "tests/programs", "tests/bad_input", "docs"})
    for (const auto& e : fs::recursive_directory_iterator(src(dir))) {
      if (!e.is_regular_file()) continue;
      std::string text = slurp(e.path().string());
      INFO(e.path().string());
      CHECK(text.find("shared/data") == std::string::npos);
    }
  std::string readme = slurp(src("README.md"));
  CHECK(readme.find("../shared/data") == std::string::npos);
  CHECK(slurp(src("scripts/run-example.sh")).find("setup.sh cli") != std::string::npos);
  CHECK(slurp(src("scripts/setup.sh")).find("--target spmdcheck") != std::string::npos);
  // "Where things are": one table (no blank line inside), each folder once.
  auto at = readme.find("| folder | what |");
  REQUIRE(at != std::string::npos);
  std::istringstream table(readme.substr(at));
  std::set<std::string> folders;
  int rows = 0;
  for (std::string l; std::getline(table, l) && !l.empty();) {
    if (l.rfind("| `", 0) != 0) continue;
    std::string folder = l.substr(2, l.find(" |", 2) - 2);
    CHECK_MESSAGE(folders.insert(folder).second, folder << " is listed twice");
    ++rows;
  }
  CHECK(folders.count("`autograd/`") == 1);  // past the blank line that split the table
  CHECK(folders.count("`bench/`") == 1);
  CHECK(rows >= 12);
}

TEST_CASE("hostile inputs (issue 23): every command checks a file's kind and size before reading it, and says where") {
  namespace fs = std::filesystem;
  const std::string dir = std::string(SPMD_BINARY_DIR) + "/hostile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string fifo = dir + "/fifo.yaml", sparse = dir + "/sparse.yaml", html = dir + "/out.html";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::ofstream(sparse).close();
  fs::resize_file(sparse, std::uintmax_t{2} << 30);  // 2 GiB of holes: nothing is written to disk
  for (const std::string& f : {std::string("/dev/zero"), fifo, sparse}) {
    Run r = run({"report", f, "-o", html});  // used to read it whole first (a hang on the FIFO, exit 3 on /dev/zero)
    CHECK(r.code == 2);
    CHECK(r.err.find(f + ":1:1: error: ") != std::string::npos);
    Run e = run({"explain", f});
    CHECK(e.code == 2);
    CHECK(e.err.find(f + ":1:1: error: ") != std::string::npos);  // a whole-file error is at 1:1
    Run u = run({"run", f});
    CHECK(u.code == 2);
    CHECK(u.out.find(f + ":1:1: error: ") != std::string::npos);
  }
  CHECK(run({"check", sparse}).out.find("sparse.yaml:1:1: error: '" + sparse + "' has 2048 MiB, more than the limit of 1024 MiB") !=
        std::string::npos);
  CHECK(run({"check", dir + "/missing.yaml"}).out.find("missing.yaml:1:1: error: cannot open file") != std::string::npos);
  // `test` of a directory holding a FIFO named .yaml: a FAIL for that file, not a hang.
  Run t = run({"test", dir});
  CHECK(t.code == 1);
  CHECK(t.out.find("FAIL " + fifo + ": failed to load:") != std::string::npos);
  CHECK(t.out.find("not a regular file") != std::string::npos);
  fs::remove(fifo);
  fs::remove(sparse);
  // A position too large for a line number is a FAIL of that file (it was `stoul`'s internal error).
  std::string huge = write_tmp("hostile_expect_huge.yaml", "# expect-error: 99999999999999999999:1: x\nmesh: {tp: 2}\nops: []\n");
  Run h = run({"test", huge});
  CHECK(h.code == 1);
  CHECK(h.out.find("gives position 99999999999999999999:1, not a line and column") != std::string::npos);
  // A subdirectory that cannot be read is a FAIL, not skipped (as root every directory is readable: nothing to test).
  fs::create_directories(dir + "/locked/inner");
  std::ofstream(dir + "/ok.yaml") << "mesh: {tp: 2}\nops: []\n";
  ::chmod((dir + "/locked").c_str(), 0);
  if (::access((dir + "/locked/inner").c_str(), F_OK) != 0) {
    Run l = run({"test", dir});
    CHECK(l.code == 1);
    CHECK(l.out.find("PASS " + dir + "/ok.yaml") != std::string::npos);
    CHECK(l.out.find("FAIL " + dir + "/locked: cannot read the directory") != std::string::npos);
  } else {
    MESSAGE("running as root: an unreadable directory cannot be made, its FAIL is not tested here");
  }
  ::chmod((dir + "/locked").c_str(), 0755);
  // A write that fails at the flush (a full disk) is reported: the DOT graph, the report, the trace.
  if (fs::exists("/dev/full")) {
    Run d = run({"check", "--dump-hb", "/dev/full", src("examples/temporal/tp_overlap.yaml")});
    CHECK(d.code == 2);
    CHECK(d.out.find("cannot write /dev/full") != std::string::npos);
    Run o = run({"report", src("examples/tp/mlp.yaml"), "-o", "/dev/full"});
    CHECK(o.code == 2);
    CHECK(o.err.find("cannot write /dev/full") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("hostile inputs (issue 23): messages show what was written, bounded and whole") {
  // A NUL byte inside a name no longer cuts the message (load errors and findings alike).
  Run n = run_stdin({"check", "-"}, std::string("mesh: {tp: 2}\nops:\n  - {op: \"Ge\\0LU\", in: [x], out: y}\n"));
  CHECK(n.code == 2);
  CHECK(n.out.find("unknown op 'Ge\\0LU'; did you mean 'GELU'?") != std::string::npos);
  Run u = run_stdin({"check", "-"}, std::string("mesh: {tp: 2}\nops:\n  - {op: GELU, in: [\"a\\0b\"], out: y}\n"));
  CHECK(u.code == 1);
  CHECK(u.out.find("a\\0b") != std::string::npos);
  CHECK(u.out.find('\0') == std::string::npos);
  // Sizes: as written (10^400, -2^63), and a division by zero is bad input, not a divisibility finding.
  auto size_error = [](const std::string& dim) {
    return run_stdin({"check", "-"}, "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, " + dim + "]}\nops: []\n");
  };
  Run big = size_error("1" + std::string(400, '0'));
  CHECK(big.code == 2);
  CHECK(big.out.find("size 10000000...0000 (401 digits) is too large") != std::string::npos);
  Run neg = size_error("-9223372036854775808");
  CHECK(neg.code == 2);
  CHECK(neg.out.find("size -9223372036854775808 is too large in magnitude") != std::string::npos);
  Run zero = size_error("8/0");
  CHECK(zero.code == 2);
  CHECK(zero.out.find("<stdin>:3:18: error: bad size expression in a dim of tensor 'x' ('8/0'): division by zero") != std::string::npos);
  // A megabyte-long CSV cell is quoted by its first bytes.
  std::string cell(1 << 20, 'Q');
  Run c = run({"check", write_tmp("hostile_cell.csv", "0F0,1" + cell + "\n")});
  CHECK(c.code == 2);
  CHECK(c.out.find("`1QQQQQQQQQQ") != std::string::npos);
  CHECK(c.out.find("more bytes)") != std::string::npos);
  CHECK(c.out.size() < 1000);
  // The JSON reader refuses what the YAML reader refuses: bytes that are not UTF-8, at the same place.
  std::string json = write_tmp("hostile_utf8.json", "{\"mesh\": {\"tp\": 2}, \"ops\": [{\"op\": \"GELU\", \"in\": [\"x\xff\"], \"out\": \"y\"}]}\n");
  std::string yaml =
      write_tmp("hostile_utf8.yaml", "{\"mesh\": {\"tp\": 2}, \"ops\": [{\"op\": \"GELU\", \"in\": [\"x\xff\"], \"out\": \"y\"}]} # yaml\n");
  Run j = run({"check", json}), y = run({"check", yaml});
  CHECK(j.code == 2);
  CHECK(y.code == 2);
  CHECK(j.out.find("hostile_utf8.json:1:53: error: invalid UTF-8: byte 0xff here cannot start a character") != std::string::npos);
  CHECK(y.out.find("hostile_utf8.yaml:1:53: error: invalid UTF-8: byte 0xff here cannot start a character") != std::string::npos);
}

TEST_CASE("run: a scaled copy keeps every shard's divisibility and the file's line numbers") {
  // H = 36 over tp = 4 divides; the copy with H = 9 (36 / 4) would not, and it passed the checker because x is
  // `uneven: true`: a program with another layout. H = 12 keeps the pattern.
  std::string uneven = write_tmp("run_scaled_uneven.yaml",
                                 "mesh: {tp: 4}\nsizes: {B: 4, H: 36}\ntensors:\n  x: {shape: [B, H], placement: {tp: S(1)}, uneven: true}\n"
                                 "  w: {shape: [H, 8]}\nops:\n  - {op: AllGather, in: [x], out: xg, axis: tp, dim: 1}\n"
                                 "  - {op: MatMul, in: [xg, w], out: y}\noutputs: {y: {placement: {tp: R}}}\n");
  Run u = run({"run", uneven});
  CHECK(u.code == 0);
  CHECK(u.out.find("scaled copy with B = 4, H = 12") != std::string::npos);
  // The copy is the file with its sizes rewritten in place: the failing Slice is on line 10 of this file (the
  // copy was re-emitted by a YAML writer, which put it on line 8).
  std::string sliced =
      write_tmp("run_scaled_lines.yaml",
                "# a comment\nmesh: {tp: 4}\nsizes:\n  B: 64    # batch\n  H: 72\ntensors:\n  x: {shape: [B, H], placement: {tp: S(1)}}\n\n"
                "ops:\n  - {op: Slice, in: [x], out: a, dim: 1, start: 0, end: H/2}\n"
                "  - {op: AllGather, in: [a], out: y, axis: tp, dim: 1}\noutputs: {y: {}}\n");
  Run l = run({"run", sliced});
  CHECK(l.code == 1);
  CHECK(l.out.find("(Slice, line 10)") != std::string::npos);
  CHECK(l.out.find("scaled copy with B = 8, H = 12") != std::string::npos);
}

TEST_CASE("equiv --declared-sizes runs without shape reduction: the README example is then too large, not a pass") {
  Run reduced = run({"equiv", src("examples/tp/mlp.yaml")});
  CHECK(reduced.code == 0);
  CHECK(reduced.out.find("run at reduced sizes that keep every partition: B 8 -> 2") != std::string::npos);
  Run declared = run({"equiv", "--declared-sizes", src("examples/tp/mlp.yaml")});
  CHECK(declared.code == 4);
  CHECK(declared.out.find("too large for the interpreter") != std::string::npos);
  CHECK(declared.out.find("reduced sizes") == std::string::npos);
}

TEST_CASE("equiv: MoE routing is equivalent for the drawn routings, said so; any other choice by value leaves it not proved") {
  Run moe = run({"equiv", src("examples/moe/deepseek_v3_moe.yaml")});
  CHECK(moe.code == 0);
  CHECK(moe.out.find("deepseek_v3_moe.yaml: equivalent for the drawn routings: 1 output equal to the spec for all real inputs routed as one of "
                     "the 3 drawn inputs") != std::string::npos);
  CHECK(moe.out.find("TopKGate (line 21) chooses the experts by value") != std::string::npos);
  // the warning stays: a routing no trial drew is not proved
  CHECK(moe.out.find("warning[value-unproved]: equivalent for the drawn routings only: ") != std::string::npos);
  // routing and a max reduction: the max is a choice no trial fixes, so every attempt runs and the verdict is not proved
  std::string f = write_tmp("route_max.yaml", R"(mesh: {ep: 2}
tensors:
  x: {shape: [8, 4], placement: {ep: S(0)}}
  wr: {shape: [4, 4]}
ops:
  - {op: MatMul, in: [x, wr], out: lg}
  - {op: TopKGate, in: [lg], out: [gw, gi], k: 2}
  - {op: ReduceMax, in: [gw], out: m, dims: [1]}
outputs:
  m: {placement: {ep: S(0)}}
)");
  Run both = run({"equiv", f});
  CHECK(both.code == 4);
  CHECK(both.out.find("route_max.yaml: not proved: equal to the spec on 8 trials") != std::string::npos);
  // a router that differs is found (its gate weights differ in the lanes whatever the routing)
  Run bug = run({"equiv", src("examples/moe/deepseek_v3_sigmoid_gate_biased_weights.yaml")});
  CHECK(bug.code == 1);
}

TEST_CASE("equiv --max-memory bounds the values a run holds: past it the check is not proved, not a crash") {
  // 512 x 512 elements of 64 bytes: 16 MiB for x, as much for y
  std::string f = write_tmp("mem.yaml", R"(mesh: {dp: 2}
tensors:
  x: {shape: [512, 512], placement: {dp: S(0)}}
ops:
  - {op: Multiply, in: [x], out: y, scalar: 2}
outputs:
  y: {placement: {dp: S(0)}}
)");
  CHECK(run({"equiv", f}).code == 0);
  Run small = run({"equiv", "--max-memory", "16", f});
  CHECK(small.code == 4);
  CHECK(small.out.find("it would hold more than 16 MiB of tensor values at once") != std::string::npos);
  CHECK(run({"equiv", "--max-memory", "8", f}).code == 2);  // below the smallest budget: a usage error
  // Recording a mismatch's run for the localization holds a slot per op and rank (2000 ops x 64 ranks x 144 bytes:
  // 18 MiB) whatever the values weigh: charged to the budget, so past it the mismatch stands, not located.
  std::string text = "mesh: {tp: 64}\ntensors:\n  x: {shape: [4, 2]}\nops:\n  - {op: Broadcast, in: [x], out: y0, axis: tp, src: 3}\n";
  for (int i = 0; i < 2000; ++i) text += fmt::format("  - {{op: Multiply, in: [y{}], out: y{}, scalar: 1}}\n", i, i + 1);
  text += "  - {op: Multiply, in: [y2000], out: z, scalar: 3}\noutputs:\n  z: {placement: {tp: R}}\n"
          "spec:\n  ops:\n    - {op: Multiply, in: [x], out: z, scalar: 2}\n  outputs: [z]\n";
  std::string g = write_tmp("record.yaml", text);
  Run located = run({"equiv", g});
  CHECK(located.code == 1);
  CHECK(located.out.find("the first plan op that goes wrong is Multiply writing z") != std::string::npos);
  Run bounded = run({"equiv", "--max-memory", "16", g});
  CHECK(bounded.code == 1);
  CHECK(bounded.out.find("value-mismatch: the plan's output differs from the spec: z[0, 0]") != std::string::npos);
  CHECK(bounded.out.find("first plan op") == std::string::npos);
}

TEST_CASE("a pipelined step too large to record whole is located by its stage cuts, recording only the ops around the first that differs") {
  // 8 layers (MatMul, Multiply, GELU) in 2 stages, 32 microbatches; layer 1 of the plan scales by 0.5 where the spec
  // scales by 0.25. At 32 MiB every value of every rank is too many to record (the previous binary: the mismatch,
  // not located); the run with every stage cut gives the first point that differs, and a run recording the ops around
  // it finds the op.
  std::string t = "mesh: {pp: 2, dp: 2}\ntensors:\n  x: {shape: [256, 32], placement: {dp: S(0)}}\n";
  for (int l = 0; l < 8; ++l) t += fmt::format("  w{}: {{shape: [32, 32], param: true}}\n", l);
  auto layer = [&](int l, const char* ind, bool plan) {
    return fmt::format(
        "{0}- {{op: MatMul, in: [h{1}, w{1}], out: a{1}}}\n{0}- {{op: Multiply, in: [a{1}], out: b{1}, scalar: {2}}}\n"
        "{0}- {{op: GELU, in: [b{1}], out: h{3}}}\n",
        ind, l, plan && l == 1 ? "0.5" : "0.25", l + 1);
  };
  t += "schedule:\n  kind: 1F1B\n  axis: pp\n  microbatches: 32\n  batch: {x: 0}\n  stages:\n"
       "    - in: [x, w0, w1, w2, w3]\n      out: [h4]\n      ops:\n        - {op: Multiply, in: [x], out: h0, scalar: 1}\n";
  for (int l = 0; l < 4; ++l) t += layer(l, "        ", true);
  t += "    - in: [h4, w4, w5, w6, w7]\n      out: [loss]\n      ops:\n";
  for (int l = 4; l < 8; ++l) t += layer(l, "        ", true);
  t += "        - {op: Sum, in: [h8], out: s, dims: [0, 1]}\n        - {op: LossScale, in: [s], out: loss, scale: 0.001}\n"
       "  merge: {loss: sum}\nloss: loss\ngrad_sync:\n";
  for (int l = 0; l < 8; ++l) t += fmt::format("  - {{op: AllReduce, in: [w{0}.grad], out: w{0}.grad, axis: dp}}\n", l);
  t += "outputs:\n  loss: {placement: {dp: P}}\nspec:\n  ops:\n    - {op: Multiply, in: [x], out: h0, scalar: 1}\n";
  for (int l = 0; l < 8; ++l) t += layer(l, "    ", false);
  t += "    - {op: Sum, in: [h8], out: s, dims: [0, 1]}\n    - {op: LossScale, in: [s], out: loss, scale: 0.001}\n  outputs: [loss]\n";
  std::string g = write_tmp("cut_located.yaml", t);
  const std::string at = "the first plan op that goes wrong is Multiply writing b1@mb0, whose value differs from the spec's b1 by every placement";
  Run whole = run({"equiv", g});  // recorded whole
  CHECK(whole.code == 1);
  CHECK(whole.out.find(at) != std::string::npos);
  Run cut = run({"equiv", "--max-memory", "32", g});
  CHECK(cut.code == 1);
  CHECK(cut.out.find("loss[] is 14.3058 in the plan and 6.29213 in the spec; " + at) != std::string::npos);
  // (the line of the op, in the stage that runs it)
  CHECK(cut.out.find("cut_located.yaml:") != std::string::npos);
  // The plan right, but stage 0's gradient all-reduce (REDUCE_GRAD) before its last backward: every stage cut point
  // holds (the gradients are compared as outputs); the ops computing the output from them, recorded alone, name the op
  // (the previous binary: not located).
  std::string fixed = t;
  fixed.replace(fixed.find("scalar: 0.5"), 11, "scalar: 0.25");
  fixed.replace(fixed.find("  kind: 1F1B\n"), 13, "  csv: early_sync.csv\n");
  fixed.replace(fixed.find("  microbatches: 32\n"), 19, "");
  Schedule sched = generate_schedule("1F1B", 2, 32);
  for (int r = 0; r < 2; ++r) {
    auto& row = sched.rows[static_cast<std::size_t>(r)];
    Action reduce{};
    reduce.type = ActionType::ReduceGrad, reduce.stage = r;
    row.insert(r == 0 ? row.end() - 1 : row.end(), reduce);  // stage 0: before its last backward (the bug); stage 1: after it
  }
  write_tmp("early_sync.csv", schedule_csv(sched));
  std::string e = write_tmp("early_sync.yaml", fixed);
  Run early = run({"equiv", "--max-memory", "128", e});  // (at 128 MiB the stage cuts are dense: 64 ops on the way)
  CHECK(early.code == 1);
  CHECK(early.out.find("disagree on a value that is R over dp") != std::string::npos);
  CHECK(early.out.find("the first plan op that goes wrong is AllReduce writing w0.grad, whose value matches no value of the spec") !=
        std::string::npos);
  Run checked = run({"check", e});
  CHECK(checked.out.find("error[grad-sync-early]: 0REDUCE_GRAD reduces stage 0's gradient") != std::string::npos);
}

TEST_CASE("a dropped or shuffled microbatch: the op that reads it points at the schedule's `batch:` order") {
  Run r = run({"equiv", src("examples/pipeline/shuffled_microbatches_bug.yaml")});
  CHECK(r.code == 1);
  CHECK(r.out.find(":36:5: note: it reads the microbatches of labels, and the schedule's `batch:` reads the parts in another order than the "
                   "microbatches' (shuffled microbatches)") != std::string::npos);
}

TEST_CASE("run: an uneven dim cut in a shard order is assembled in that order, and its holders named in it") {
  // 6 elements, tp first then dp (nested torch.chunk blocks: 3, 3 over tp, then 2, 1 over dp): element 2 is on rank
  // {dp: 1, tp: 0}. The plan's value is cut in mesh order, so the assembly by the declared order differs there.
  const std::string f = write_tmp("strided_uneven.yaml", R"(mesh: {dp: 2, tp: 2}
tensors:
  x: {shape: [6], placement: {dp: S(0), tp: S(0)}, uneven: true}
ops:
  - {op: Multiply, in: [x], out: y, scalar: 2}
outputs:
  y: {placement: {dp: S(0), tp: S(0), order: [tp, dp]}}
)");
  Run r = run({"run", f});
  CHECK(r.code == 1);
  CHECK(r.out.find("output y differs at [2]") != std::string::npos);
  CHECK(r.out.find("(held by ranks {dp: 1, tp: 0})") != std::string::npos);  // (before: not assembled, "not modelled by the oracle")
}

TEST_CASE("check takes equiv's budgets for the value check of a file with a spec") {
  const std::string big = write_tmp("check_budget.yaml", R"(mesh: {tp: 2}
tensors:
  x: {shape: [512, 1024]}
  w: {shape: [1024, 1024], placement: {tp: S(1)}}
ops:
  - {op: MatMul, in: [x, w], out: y}
outputs:
  y: {placement: {tp: S(1)}}
spec:
  ops:
    - {op: MatMul, in: [x, w], out: y}
  outputs: [y]
)");
  Run by_default = run({"check", big});  // 2 x 512 x 1024 x 1024 multiply-adds: past the default 250,000,000
  CHECK(by_default.out.find("warning[value-unproved]: equivalence not checked: the run exceeds the interpreter's work limit") != std::string::npos);
  Run more = run({"check", "--max-work", "3000000000", big});
  CHECK(more.code == 0);
  CHECK(more.out.empty());
  Run small = run({"check", "--max-work", "3000000000", "--max-memory", "16", big});
  CHECK(small.out.find("it would hold more than 16 MiB of tensor values at once") != std::string::npos);
  CHECK(run({"check", "--max-memory", "8", big}).code == 2);  // below the smallest budget equiv takes
}

TEST_CASE("backward keeps the named sizes, so a hand-written copy of its output is checked at reduced sizes") {
  Run back = run({"backward", src("examples/autograd/megatron_mlp.yaml")});
  REQUIRE(back.code == 0);
  CHECK(back.out.find("sizes:\n  B: 8\n  S: 128\n  H: 256\n  F: 1024\n") != std::string::npos);
  CHECK(back.out.find("{op: Expand, in: [y.grad.c.kd], out: y.grad.c, shape: [B, S, H], scale: 7.62939453125e-06}") != std::string::npos);
  Run eq = run({"equiv", write_tmp("megatron_mlp_backward.yaml", back.out)});
  CHECK(eq.code == 0);  // with numbers for shapes it ran at 8 x 128 x 256 and passed the work budget ("not checked")
  CHECK(eq.out.find("run at reduced sizes that keep every partition: B 8 -> 4") != std::string::npos);
  // GQA's kv heads replicated over tpi: one kv head per rank is an obligation on the named sizes (it was a rule a size
  // variable did not decide, and the printed step had numbers); from standard input too
  Run gqa = run_stdin({"backward", "-"}, slurp(src("examples/llama/gqa_rope_tp_train.yaml")));
  CHECK(gqa.code == 0);
  CHECK(gqa.out.find("{op: Reshape, in: [q2], out: q, shape: [B, S, NH, D]}") != std::string::npos);
  // a pipelined schedule derives its stages' backwards when checked: a located error, not a program that does not load
  Run pp = run({"backward", src("examples/pipeline/pp_1f1b_adamw.yaml")});
  CHECK(pp.code == 2);
  CHECK(pp.out.find("pp_1f1b_adamw.yaml:35:3: error: a pipelined schedule's backward is derived per stage") != std::string::npos);
}

TEST_CASE("a local-view training step: check compares the hand-written backward's gradients; backward and report do not derive one") {
  const std::string fixed = src("examples/local/megatron_mlp_custom_backward_fixed.yaml");
  Run eq = run({"equiv", fixed});
  CHECK(eq.code == 0);
  CHECK(eq.out.find("equivalent: 3 outputs equal to the spec") != std::string::npos);  // the loss and both gradients
  Run bug = run({"check", src("examples/local/megatron_mlp_custom_backward_bug.yaml")});
  CHECK(bug.code == 1);
  CHECK(bug.out.find("error[value-mismatch]: the plan's output differs from the spec: w1.grad[0, 0] is 2082 in the plan and 1041 in the spec") !=
        std::string::npos);
  Run back = run({"backward", fixed});
  CHECK(back.code == 2);
  CHECK(back.out.find(":10:7: error: a local-view program (`view: local`) has no derived backward") != std::string::npos);
  Run rep = run({"report", fixed, "-o", "-"});
  CHECK(rep.code == 0);
  CHECK(rep.out.find("<html") != std::string::npos);
}
