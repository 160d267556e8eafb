// tests/test_oracle.cpp - the numeric oracle: its own semantics, every example and test program, and the
// fixed-seed differential run of the checker against it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cli/driver.h"
#include "cli/run.h"
#include "equiv/equiv.h"
#include "interp/interp.h"
#include "interp/scale.h"
#include "ir/loader.h"
#include "tests/difftest.h"

using namespace spmd;

namespace {

std::string src(const std::string& rel) { return std::string(SPMD_SOURCE_DIR) + "/" + rel; }

OracleResult oracle(const std::string& yaml, std::uint64_t seed = 0) {
  OracleOptions o;
  o.seed = seed;
  return run_oracle(load_program_string(yaml, "t.yaml"), o);
}

const char* kHead = "mesh: {tp: 4}\ntensors:\n  x: {shape: [8, 16], placement: {tp: S(1)}}\n  w: {shape: [16, 4], placement: {tp: S(0)}}\n";

// How many of 3000 generated programs (seeds from `first`) contain each key; `extra(line, here)` adds keys that
// need more than a substring. Each key must occur in at least 5; the counts are printed after `what`.
template <class Extra>
void check_coverage(const std::string& what, std::uint64_t first, const std::vector<std::string>& keys, Extra&& extra) {
  std::map<std::string, int> seen;
  for (std::uint64_t s = 0; s < 3000; ++s) {
    std::istringstream t(test::generate_program(first + s));
    std::set<std::string> here;
    for (std::string line; std::getline(t, line);) {
      for (const auto& k : keys)
        if (line.find(k) != std::string::npos) here.insert(k);
      extra(line, here);
    }
    for (const auto& k : here) ++seen[k];
  }
  std::string counts;
  for (const auto& k : keys) {
    INFO(k);
    CHECK(seen[k] >= 5);
    counts += (counts.empty() ? "" : ", ") + k + " " + std::to_string(seen[k]);
  }
  MESSAGE(what << " in 3000 generated programs: " << counts);
}

}  // namespace

TEST_CASE("oracle: row-parallel matmul agrees only after the all-reduce") {
  std::string ok =
      std::string(kHead) + "ops:\n  - {op: MatMul, in: [x, w], out: p}\n  - {op: AllReduce, in: [p], out: y, axis: tp}\noutputs:\n  y: {}\n";
  CHECK(oracle(ok).verdict == OracleVerdict::Agree);
  // P declared: assembled by summing the ranks' pieces, so it agrees too
  std::string partial = std::string(kHead) + "ops:\n  - {op: MatMul, in: [x, w], out: p}\noutputs:\n  p: {placement: {tp: P}}\n";
  CHECK(oracle(partial).verdict == OracleVerdict::Agree);
  // claimed R: the ranks hold different summands
  std::string missing = std::string(kHead) + "ops:\n  - {op: MatMul, in: [x, w], out: p}\noutputs:\n  p: {placement: {tp: R}}\n";
  OracleResult r = oracle(missing);
  CHECK(r.verdict == OracleVerdict::Differ);
  CHECK(r.message.find("disagree") != std::string::npos);
}

TEST_CASE("oracle: the bias added before the all-reduce is counted once per rank") {
  std::string bad = std::string(kHead) +
                    "  b: {shape: [4]}\nops:\n  - {op: MatMul, in: [x, w], out: p}\n  - {op: Add, in: [p, b], out: q}\n"
                    "  - {op: AllReduce, in: [q], out: y, axis: tp}\noutputs:\n  y: {}\n";
  OracleResult r = oracle(bad);
  CHECK(r.verdict == OracleVerdict::Differ);
  CHECK(r.message.find("output y differs") != std::string::npos);
}

TEST_CASE("oracle: collectives, conversions and outputs assembled by placement") {
  auto agree = [](const std::string& body) { return oracle("mesh: {dp: 2, tp: 2}\ntensors:\n" + body).verdict == OracleVerdict::Agree; };
  // AllGather of a two-axis shard, inner axis first (outer major)
  CHECK(
      agree("  x: {shape: [8, 4], placement: {dp: S(0), tp: S(0)}}\nops:\n  - {op: AllGather, in: [x], out: a, axis: tp, dim: 0}\n"
            "  - {op: AllGather, in: [a], out: y, axis: dp, dim: 0}\noutputs:\n  y: {}\n"));
  // ReduceScatter, then AllToAll moving the shard to another dim
  CHECK(
      agree("  x: {shape: [8, 4], placement: {tp: P}}\nops:\n  - {op: ReduceScatter, in: [x], out: s, axis: tp, dim: 0}\n"
            "  - {op: AllToAll, in: [s], out: t, axis: tp, split_dim: 1, concat_dim: 0}\noutputs:\n  t: {placement: {tp: S(1)}}\n"));
  // Convert R -> S takes the local slice; Mean over a shard is P(avg)
  CHECK(
      agree("  x: {shape: [8, 4]}\nops:\n  - {op: Convert, in: [x], out: s, axis: dp, to: S(0)}\n  - {op: Mean, in: [s], out: m, dims: [0]}\n"
            "  - {op: AllReduce, in: [m], out: y, axis: dp, reduce: avg}\noutputs:\n  y: {}\n"));
  // R + S(d): the R operand is read as its local slice
  CHECK(
      agree("  x: {shape: [8, 4], placement: {tp: S(0)}}\n  b: {shape: [8, 4]}\nops:\n  - {op: Add, in: [x, b], out: y}\n"
            "outputs:\n  y: {placement: {tp: S(0)}}\n"));
  // a shard reshaped on its leftmost merged dim keeps its place; on another dim it does not
  CHECK(
      agree("  x: {shape: [4, 2, 6], placement: {tp: S(0)}}\nops:\n  - {op: Reshape, in: [x], out: y, shape: [8, 6]}\noutputs:\n  y: {placement: "
            "{tp: S(0)}}\n"));
  CHECK(oracle("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 6], placement: {tp: S(1)}}\nops:\n  - {op: Reshape, in: [x], out: y, shape: [6, 4]}\n"
               "outputs:\n  y: {placement: {tp: S(0)}}\n")
            .verdict == OracleVerdict::Differ);
}

TEST_CASE("oracle: vocab-parallel cross-entropy and the gathered-logits bug (Megatron #7452)") {
  std::string head = "mesh: {tp: 4}\ntensors:\n  lg: {shape: [2, 3, 8], placement: {tp: S(2)}}\n  lb: {shape: [2, 3], dtype: i64}\nops:\n";
  CHECK(oracle(head + "  - {op: CrossEntropyLoss, in: [lg, lb], out: loss, vocab_parallel: true}\noutputs:\n  loss: {}\n").verdict ==
        OracleVerdict::Agree);
  OracleResult r = oracle(head +
                          "  - {op: AllGather, in: [lg], out: full, axis: tp, dim: 2}\n"
                          "  - {op: CrossEntropyLoss, in: [full, lb], out: loss, vocab_parallel: true}\noutputs:\n  loss: {}\n");
  CHECK(r.verdict == OracleVerdict::Differ);
  CHECK(r.max_diff == doctest::Approx(std::log(4.0)));
}

TEST_CASE("oracle: what it cannot compare is skipped, never agreement") {
  OracleResult v = oracle(
      "mesh: {tp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: Convert, in: [x], out: y, axis: tp, to: V}\noutputs:\n  y: {placement: {tp: V}}\n");
  CHECK(v.verdict == OracleVerdict::Skipped);
  OracleResult none = oracle("mesh: {tp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: GELU, in: [x], out: y}\n");
  CHECK(none.verdict == OracleVerdict::Skipped);
  OracleOptions small;
  small.max_elements = 16;
  CHECK(run_oracle(load_program_string("mesh: {tp: 2}\ntensors:\n  x: {shape: [64, 64]}\nops: []\noutputs:\n  x: {}\n", "t.yaml"), small).verdict ==
        OracleVerdict::Skipped);
}

TEST_CASE("oracle: symbolic sizes take small allowed values, one instantiation per seed") {
  std::string p =
      "mesh: {tp: T}\nsizes:\n  T: {in: [1, 2, 4]}\n  H: {min: 8, multiple_of: 8}\ntensors:\n  x: {shape: [4, H], placement: {tp: S(1)}}\n"
      "ops:\n  - {op: AllGather, in: [x], out: y, axis: tp, dim: 1}\noutputs:\n  y: {}\n";
  std::set<std::string> seen;
  for (std::uint64_t s = 0; s < 6; ++s) {
    OracleResult r = oracle(p, s);
    CHECK(r.verdict == OracleVerdict::Agree);
    seen.insert(r.sizes);
  }
  CHECK(seen.size() > 3);
  // H/3 is not a size for H = 8: the single-device program has no value there
  std::string inexact = "mesh: {tp: 2}\nsizes:\n  H: {min: 8, multiple_of: 8}\ntensors:\n  x: {shape: [H/3]}\nops: []\noutputs:\n  x: {}\n";
  CHECK(oracle(inexact, 0).verdict == OracleVerdict::GlobalError);
}

TEST_CASE("oracle: scaled copies keep the checker's verdict") {
  std::string text =
      "mesh: {tp: 4}\nsizes: {B: 8, H: 1024}\ntensors:\n  x: {shape: [B, H], placement: {tp: S(1)}}\nops: []\noutputs:\n  x: {placement: {tp: "
      "S(1)}}\n";
  auto sizes = named_sizes(text);
  CHECK(sizes.at("H") == 1024);
  auto t = with_sizes(text, {{"H", 16}});
  REQUIRE(t);
  CHECK(load_program_string(*t, "t.yaml").tensors[0].shape.size() == 2);
  RunReport r = run_program_text(text, "t.yaml");
  CHECK(r.oracle.verdict == OracleVerdict::Agree);
  CHECK(r.run_sizes.find("H = ") != std::string::npos);
}

TEST_CASE("spmdcheck run: exit codes and output") {
  std::ostringstream out, err;
  CHECK(run_cli({"run", src("examples/tp/mlp.yaml")}, out, err) == 0);
  CHECK(out.str().find("agree") != std::string::npos);
  std::ostringstream out2, err2;
  CHECK(run_cli({"run", "--seed", "3", src("examples/tp/mlp_bias_before_allreduce.yaml")}, out2, err2) == 1);
  CHECK(out2.str().find("differ") != std::string::npos);
  CHECK(out2.str().find("checker: partial-misuse") != std::string::npos);
  std::ostringstream out3, err3;
  CHECK(run_cli({"run", src("tests/bad_input/empty_file.yaml")}, out3, err3) == 2);
  std::ostringstream out4, err4;
  CHECK(run_cli({"run", src("tests/programs/collectives/gather_ok.yaml")}, out4, err4) == 4);
}

// Every example and test program: a correct one (no spatial ID expected) agrees on every seed; a spatially
// buggy one differs on some seed. A file whose numbers cannot show its point says why in a `# oracle:`
// comment, and the comment must stay true.
TEST_CASE("oracle: every example and test program") {
  static const std::set<std::string> spatial = {"shape-mismatch",     "partial-misuse", "sharded-reduction-dim", "layout-conflict", "invariant-mix",
                                                "illegal-collective", "partial-output", "placement-mismatch",    "undefined-tensor"};
  std::vector<std::string> files;
  for (const char* dir : {"examples", "tests/programs", "docs/tutorial"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(src(dir)))
      if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  CHECK(files.size() > 300);
  int agree = 0, refuted = 0, explained = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    bool commented = text.find("# oracle:") != std::string::npos;
    Program p = load_program_string(text, f);
    if (p.has_spec) {  // judged against its spec (the model), not against its own ops on one device
      bool mismatch = std::find(p.expect.begin(), p.expect.end(), "value-mismatch") != p.expect.end();
      bool unproved = std::find(p.expect.begin(), p.expect.end(), "value-unproved") != p.expect.end();
      bool other = !p.expect.empty() && !mismatch && !unproved;  // e.g. a lineage that does not fit: never equivalent
      EquivResult r = check_equivalence(p);
      EquivVerdict v = r.verdict;
      // (equivalent for the drawn routings keeps a value-unproved warning: other routings are not proved)
      CHECK_MESSAGE((mismatch   ? v == EquivVerdict::Mismatch
                     : unproved ? (v == EquivVerdict::Unknown || v == EquivVerdict::Skipped || (v == EquivVerdict::Equivalent && r.drawn_routings))
                     : other    ? v != EquivVerdict::Equivalent
                                : v == EquivVerdict::Equivalent),
                    "the value check's verdict does not fit `expect:`: " << f);
      continue;
    }
    // Per-rank programs run too: ranks that pair the wrong collectives or receive another value show it in their run.
    static const std::set<std::string> communication = {"collective-mismatch", "p2p-mismatch"};
    bool buggy =
        std::any_of(p.expect.begin(), p.expect.end(), [](const std::string& id) { return spatial.count(id) > 0 || communication.count(id) > 0; });
    bool any_bad = false, all_agree = true;
    std::string msg;
    for (std::uint64_t s = 0; s < 4; ++s) {
      RunOptions o;
      o.seed = s;
      RunReport r = run_program_text(text, f, o);
      bool bad = r.oracle.verdict == OracleVerdict::Differ || r.oracle.verdict == OracleVerdict::GlobalError;
      any_bad |= bad;
      all_agree &= r.oracle.verdict == OracleVerdict::Agree;
      if ((bad && !buggy) || msg.empty()) msg = render_run(f, r);
    }
    INFO(msg);
    if (!buggy) {
      CHECK_MESSAGE(!any_bad, "a correct program whose numbers differ: " << f);
      if (all_agree)
        ++agree;
      else
        CHECK_MESSAGE(commented, "a correct program the oracle skips needs a `# oracle:` comment saying why: " << f);
      if (all_agree) CHECK_MESSAGE(!commented, "stale `# oracle:` comment (the program agrees): " << f);
      if (!all_agree && commented) ++explained;
    } else if (any_bad) {
      ++refuted;
      CHECK_MESSAGE(!commented, "stale `# oracle:` comment (the numbers do show the bug): " << f);
    } else {
      ++explained;
      CHECK_MESSAGE(commented, "a buggy program whose numbers agree needs a `# oracle:` comment saying why values cannot show it: " << f);
    }
  }
  MESSAGE(files.size() << " programs: " << agree << " correct ones agree, " << refuted << " buggy ones refuted numerically, " << explained
                       << " explained by a `# oracle:` comment");
}

TEST_CASE("differential: the checker against the oracle on random programs (fixed seed)") {
  int count = 10000;
  if (const char* c = std::getenv("SPMD_DIFFTEST_COUNT")) count = std::atoi(c);
  auto st = test::run_difftest(20240601, count, 3, false);
  MESSAGE(test::render_stats(st));
  CHECK(st.soundness.empty());
  CHECK(st.passed > count / 4);
  CHECK(st.rejected > count / 10);
}

TEST_CASE("differential: the generator covers the MoE ops, and the checker passes some of them") {
  int dispatch = 0, combine = 0, expert = 0, passed = 0, agree = 0;
  for (std::uint64_t s = 0; s < 600; ++s) {
    std::string t = test::generate_program(s);
    bool d = t.find("op: MoEDispatch") != std::string::npos;
    dispatch += d;
    combine += t.find("op: MoECombine") != std::string::npos;
    expert += t.find("op: ExpertCompute") != std::string::npos;
    if (!d) continue;
    RunReport r = run_program_text(t, "gen.yaml", RunOptions{});
    bool clean = !r.load_error && r.checker_ids.empty();
    passed += clean;
    agree += clean && r.oracle.verdict == OracleVerdict::Agree;
    INFO(t);
    CHECK_FALSE((clean && (r.oracle.verdict == OracleVerdict::Differ || r.oracle.verdict == OracleVerdict::GlobalError)));
  }
  MESSAGE(dispatch << " programs with MoEDispatch (" << passed << " pass the checker, " << agree << " agree numerically), " << combine
                   << " with MoECombine, " << expert << " with ExpertCompute");
  CHECK(dispatch > 15);
  CHECK(combine > 10);
  CHECK(expert > 8);
  CHECK(passed > 3);
}

TEST_CASE("differential: the generator covers the context-parallel ops") {
  const std::vector<std::string> keys = {"RingRotate",        "RingAttentionStep", "RingAttention,",    "LoadBalance",
                                         "FlashAttention cp", "order: zigzag",     "direction: inverse"};
  check_coverage("context-parallel ops", 0, keys, [](const std::string& line, std::set<std::string>& here) {
    if (line.find("FlashAttention") != std::string::npos && line.find(", cp: ") != std::string::npos) here.insert("FlashAttention cp");
  });
}

TEST_CASE("differential: the generator covers grouped-query attention, a tp of 1 and dims cut unevenly by several axes") {
  // (the rules these reach: GQA's kv heads per rank and uneven head cuts checked rank by rank, an axis of one rank,
  // DTensor's nested torch.chunk blocks)
  std::map<std::string, std::string> heads;  // a declared 4-d value's dim 1 (names repeat across programs: decls come first)
  check_coverage("attention and uneven layouts", 0, {"tp: 1}", "grouped-query attention", "uneven over several axes"},
                 [&](const std::string& line, std::set<std::string>& here) {
                   auto shape = line.find(": {shape: [");
                   if (shape != std::string::npos) {
                     std::string name = line.substr(2, line.find(':') - 2);
                     std::string dims = line.substr(shape + 11, line.find(']', shape) - shape - 11);
                     auto c1 = dims.find(','), c2 = dims.find(',', c1 + 1);
                     if (std::count(dims.begin(), dims.end(), ',') == 3) heads[name] = dims.substr(c1 + 2, c2 - c1 - 2);
                     if (line.find("uneven: true") != std::string::npos)
                       for (char d = '0'; d <= '3'; ++d) {
                         std::string sd = std::string("S(") + d + ")";
                         auto first = line.find(sd);
                         if (first != std::string::npos && line.find(sd, first + 1) != std::string::npos) here.insert("uneven over several axes");
                       }
                   }
                   for (std::string op : {"op: FlashAttention, in: [", "op: RingAttention, in: [", "op: RingAttentionStep, in: ["}) {
                     auto at = line.find(op);
                     if (at == std::string::npos) continue;
                     std::string ins = line.substr(at + op.size(), line.find(']', at) - at - op.size());
                     auto c1 = ins.find(','), c2 = ins.find(',', c1 + 1);
                     std::string q = ins.substr(0, c1), k = ins.substr(c1 + 2, c2 - c1 - 2);
                     if (heads.count(q) && heads.count(k) && heads[q] != heads[k]) here.insert("grouped-query attention");
                   }
                 });
}

TEST_CASE("differential: the generator covers the FP8 ops (scales, histories, FP8 collectives)") {
  int history = 0, scale_op = 0, exchanged = 0;
  for (std::uint64_t s = 0; s < 3000; ++s) {
    std::string t = test::generate_program(20240601 + s);
    history += t.find("op: AmaxHistory") != std::string::npos;
    scale_op += t.find("op: FP8Scale") != std::string::npos;
    exchanged += t.find("in: [q") != std::string::npos && t.find("out: qc") != std::string::npos;
  }
  MESSAGE(history << " amax histories, " << scale_op << " FP8Scale, " << exchanged << " FP8 collectives");
  CHECK(history > 10);
  CHECK(scale_op > 30);
  CHECK(exchanged > 20);
}

// Local view (docs/format.md, "Local view"): the column/row parallel MLP each rank runs on its local pieces assembles to
// the single-device value; without its AllReduce (each rank keeps a summand of an output declared R) it differs.
TEST_CASE("oracle: local-view MLP agrees with the single-device run, and differs without its AllReduce") {
  const std::string head = R"(view: local
mesh: {tp: 2}
sizes: {B: 4, H: 8, F: 16}
tensors:
  x:  {shape: [B, H]}
  w1: {shape: [H, F], placement: {tp: S(1)}}
  w2: {shape: [F, H], placement: {tp: S(0)}}
ops:
  - {op: MatMul, in: [x, w1], out: h}
  - {op: GELU, in: [h], out: a}
  - {op: MatMul, in: [a, w2], out: yp}
)";
  Program good = load_program_string(head + "  - {op: AllReduce, in: [yp], out: y, axis: tp}\noutputs:\n  y: {placement: {tp: R}}\n", "good.yaml");
  CHECK(run_oracle(good).verdict == OracleVerdict::Agree);
  Program bad = load_program_string(head + "  - {op: Exp, in: [yp], out: y}\noutputs:\n  y: {placement: {tp: R}}\n", "bad.yaml");
  CHECK(run_oracle(bad).verdict == OracleVerdict::Differ);
  // positions that start at 0 on every rank (RoPE under context parallelism, TrainVerify's C1) differ too
  Program pos = load_program_string(
      "view: local\nmesh: {cp: 2}\nsizes: {S: 8}\nops:\n  - {op: Arange, out: p, end: S/cp}\noutputs:\n  p: {placement: {cp: S(0)}}\n", "pos.yaml");
  CHECK(run_oracle(pos).verdict == OracleVerdict::Differ);
  // the JSON fast path knows `view` and axis_index
  Program js = load_program_string(
      R"J({"view": "local", "mesh": {"tp": 2}, "tensors": {"x": {"shape": [2, 8]}}, "ops": [{"op": "Slice", "in": ["x"], "out": "y", "dim": 1, "start": "axis_index(tp)*8/tp", "end": "(axis_index(tp) + 1)*8/tp"}], "outputs": {"y": {"placement": {"tp": "S(1)"}}}})J",
      "j.json");
  CHECK(js.local_view);
  CHECK(run_oracle(js).verdict == OracleVerdict::Agree);
  CHECK_THROWS_AS(
      load_program_string(
          R"J({"mesh": {"tp": 2}, "tensors": {"x": {"shape": [2, 8]}}, "ops": [{"op": "Slice", "in": ["x"], "out": "y", "dim": 1, "start": "axis_index(tp)*4", "end": 8}]})J",
          "g.json"),
      LoadError);
}

TEST_CASE("differential: the generator covers masks, counts, running sums, the attention scale and split sizes") {
  const std::vector<std::string> keys = {"op: Sigmoid",  "op: Detach", "op: Eq",     "op: Lt",       "op: Ge",     "op: And",
                                         "op: Or",       "op: Not",    "op: OneHot", "op: Bincount", "op: CumSum", "FlashAttention scale",
                                         "split_sizes: "};
  check_coverage("masks, counts, sums, scales and split sizes", 20240601, keys, [](const std::string& line, std::set<std::string>& here) {
    if (line.find("op: FlashAttention") != std::string::npos && line.find("scale: ") != std::string::npos) here.insert("FlashAttention scale");
  });
}
