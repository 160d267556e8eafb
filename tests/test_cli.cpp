// tests/test_cli.cpp - exit codes, JSON output, `spmdcheck test`, and the generated docs/ops.md.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "cli/driver.h"
#include "ir/op_table.h"

using namespace spmd;

namespace {

struct Run {
  int code;
  std::string out, err;
};

Run run(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int code = run_cli(args, out, err);
  return {code, out.str(), err.str()};
}

std::string src(const std::string& rel) { return std::string(SPMD_SOURCE_DIR) + "/" + rel; }

std::string write_tmp(const std::string& name, const std::string& text) {
  std::string path = std::string(SPMD_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

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
  CHECK(z.out.find("/dev/zero: error: '/dev/zero' is not a regular file") != std::string::npos);
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
  // A diagnostic that echoes bytes that are not UTF-8 still prints valid JSON (they become U+FFFD).
  std::string bad_utf8 = write_tmp("bad_utf8.yaml", "mesh: {dp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: GELU, in: [x\xff\xfe], out: y}\n");
  Run j = run({"check", "--format", "json", bad_utf8});
  CHECK(j.code == 1);
  CHECK(j.out.find("\"id\": \"undefined-tensor\"") != std::string::npos);
  CHECK(j.out.find("\xef\xbf\xbd") != std::string::npos);
  std::string bad_key = write_tmp("bad_utf8_key.yaml", "mesh: {dp: 2}\nops: []\nx\xff: 1\n");
  Run k = run({"check", "--format", "json", bad_key});
  CHECK(k.code == 2);
  CHECK(k.out.find("\"files\"") != std::string::npos);
  // Schedules: bounded before anything is allocated.
  Run g = run({"schedule", "gen", "--kind", "Interleaved1F1B", "--stages", "4096", "--microbatches", "1048576", "--virtual", "64"});
  CHECK(g.code == 2);
  CHECK(g.err.find("more than the 2500000 a schedule may have") != std::string::npos);
  std::string big = write_tmp("schedule_1m.yaml", "mesh: {pp: 4}\nschedule: {kind: 1F1B, microbatches: 1048576}\n");
  Run s = run({"check", "--format", "json", big});
  CHECK(s.code == 2);
  CHECK(s.out.find("\"line\": 2") != std::string::npos);
  std::string rows;
  for (int r = 0; r < 65537; ++r) rows += "0F0\n";
  Run c = run({"check", "--format", "json", write_tmp("rows.csv", rows)});
  CHECK(c.code == 2);
  CHECK(c.out.find("at most 65536 are supported") != std::string::npos);
}
