// tests/test_interp_budget.cpp - the interpreter's limits (issue 20): every element buffer is charged against the
// element and memory limits before its memory is touched, each allocation path of a run ends in BudgetError (a
// skipped `run`, a `value-unproved` equivalence check located at the op), never in bad_alloc; and the element
// buffer is shared by copies until one is written (copy on write).
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <utility>

#include "cli/driver.h"
#include "equiv/equiv.h"
#include "interp/interp.h"
#include "interp/runner.h"
#include "ir/loader.h"

namespace spmd {
namespace {

using namespace interp;

// Sets the thread's allocation limits for one test and restores the previous ones after it.
struct Limits {
  AllocLimits saved = alloc_limits();
  explicit Limits(AllocLimits l) { set_alloc_limits(l); }
  ~Limits() { set_alloc_limits(saved); }
};

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

OracleResult run_small(const std::string& yaml, std::int64_t max_elements = 1 << 12, std::int64_t max_bytes = std::int64_t{1} << 20) {
  OracleOptions o;
  o.max_elements = max_elements;
  o.max_bytes = max_bytes;
  return run_oracle(load_program_string(yaml, "t.yaml"), o);
}

}  // namespace

TEST_CASE("budget: a tensor over the element limit is refused before any memory is taken") {
  Limits l({16, std::int64_t{1} << 20});
  std::int64_t before = live_bytes();
  CHECK_THROWS_AS(Tensor({4, 5}), BudgetError);
  CHECK_THROWS_AS(Tensor::uninit({4, 5}), BudgetError);
  // a shape whose element count overflows a word is too large, not a wrapped small count
  CHECK(numel_of({std::int64_t{1} << 40, std::int64_t{1} << 40}) == INT64_MAX);
  CHECK_THROWS_AS(Tensor({std::int64_t{1} << 40, std::int64_t{1} << 40}), BudgetError);
  CHECK(live_bytes() == before);
  try {
    Tensor t({1 << 20, 1 << 20});
  } catch (const BudgetError& e) {
    CHECK(has(e.what(), "a tensor of shape [1048576, 1048576] is too large"));
    CHECK(!e.bytes);  // too large however the runs are made
  }
  Tensor ok({4, 4});
  CHECK(ok.numel() == 16);
}

TEST_CASE("budget: bytes live are charged before allocating, and shared copies count once") {
  Limits l({1 << 20, 300 << 10});  // 300 KiB of values: four buffers of 1000 elements
  std::int64_t base = live_bytes();
  REQUIRE(base == 0);
  {
    Tensor a({1000});  // 64 KB
    std::int64_t one = live_bytes() - base;
    CHECK(one >= static_cast<std::int64_t>(1000 * sizeof(Num)));
    Tensor b = a;  // shared: nothing new
    CHECK(live_bytes() - base == one);
    CHECK(b.data.shared());
    Tensor r = interp::reshape(a, {10, 100});  // a reshape shares too
    CHECK(live_bytes() - base == one);
    b.data[0] = Num(3.0);  // the first write copies
    CHECK(live_bytes() - base == 2 * one);
    CHECK(!b.data.shared());
    CHECK(std::as_const(a).data[0].d == 0);  // (a read through a const handle: a non-const one would copy the shared buffer)
    CHECK(std::as_const(b).data[0].d == 3);
    Tensor c({1000}), d({1000});  // 4 buffers live now
    std::int64_t full = live_bytes();
    CHECK_THROWS_AS(Tensor({1000}), BudgetError);  // a fifth would pass 300 KiB
    CHECK(live_bytes() == full);
    try {
      Tensor e({1000});
    } catch (const BudgetError& e) {
      CHECK(has(e.what(), "it would hold more than 300 KiB of tensor values at once"));
      CHECK(e.bytes);  // (the one limit a trial made again one run at a time can pass: equiv.cpp, trial)
    }
  }
  CHECK(live_bytes() == base);
}

TEST_CASE("budget: replicas of a declared input share one buffer until one is written") {
  // x is replicated over dp and cut over tp: 2 distinct blocks on 8 ranks, each drawn once
  Program p = load_program_string(R"(mesh: {dp: 4, tp: 2}
tensors:
  x: {shape: [8, 6], placement: {tp: S(1)}}
ops:
  - {op: Multiply, in: [x], out: y, scalar: 2}
outputs:
  y: {}
)",
                                  "share.yaml");
  std::int64_t base = live_bytes(), work = std::int64_t{1} << 30;
  const OracleOptions oo;  // (the Runner keeps a reference to its options)
  {
    Runner run(p, {}, {4, 2}, false, oo, work);
    run.declare(p.tensors[0], 0, 5);
    const NameId x = p.tensors[0].name;
    CHECK(live_bytes() - base < static_cast<std::int64_t>(3 * 24 * sizeof(Num)));  // two blocks of 24, not eight
    for (std::int64_t r = 0; r < 8; ++r) CHECK(run.at(r, x).t.data.shared());
    // rank 0 (dp 0, tp 0) and rank 2 (dp 1, tp 0) hold the same block; rank 1 (tp 1) the other
    CHECK(std::as_const(run.at(0, x).t).data.data() == std::as_const(run.at(2, x).t).data.data());
    CHECK(std::as_const(run.at(0, x).t).data.data() != std::as_const(run.at(1, x).t).data.data());
    const double was = std::as_const(run.at(2, x).t).data[0].d;
    run.at(0, x).t.data[0] = Num(was + 1);  // a write copies: the replica keeps its value
    CHECK(std::as_const(run.at(2, x).t).data[0].d == was);
    CHECK(std::as_const(run.at(0, x).t).data[0].d == was + 1);
  }
  CHECK(live_bytes() == base);
}

// One program per allocation path of a run: each ends as `skipped` with the reason, never a crash.
TEST_CASE("budget: every allocation path of a run stops at the limit") {
  struct Case {
    const char* what;
    const char* yaml;
    const char* reason;
  };
  const Case cases[] = {
      {"Expand",
       "mesh: {tp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: Expand, in: [x], out: y, shape: [1048576, 1048576, 4]}\noutputs:\n  y: {}\n",
       "is too large"},
      {"Expand in the local view",
       "mesh: {tp: 2}\nview: local\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: Expand, in: [x], out: y, shape: [1048576, 1048576, 4]}\noutputs:\n  "
       "y: {}\n",
       "is too large"},
      {"Pad",
       "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 4]}\nops:\n  - {op: Pad, in: [x], out: y, dim: 0, before: 1099511627776}\noutputs:\n  y: {}\n",
       "is too large"},
      {"broadcast",
       "mesh: {tp: 2}\ntensors:\n  a: {shape: [512, 1]}\n  b: {shape: [1, 512]}\nops:\n  - {op: Add, in: [a, b], out: y}\noutputs:\n  y: {}\n",
       "is too large"},
      {"MatMul",
       "mesh: {tp: 2}\ntensors:\n  a: {shape: [512, 1]}\n  b: {shape: [1, 512]}\nops:\n  - {op: MatMul, in: [a, b], out: y}\noutputs:\n  y: {}\n",
       "is too large"},
      {"Arange", "mesh: {tp: 2}\ntensors:\n  x: {shape: [4]}\nops:\n  - {op: Arange, out: y, end: 1099511627776}\noutputs:\n  y: {}\n",
       "is too large"},
      {"MoE buffer",
       "mesh: {ep: 2}\nsizes: {T: 8, H: 4, E: 2}\ntensors:\n  x: {shape: [T, H], placement: {ep: S(0)}}\n  router: {shape: [H, E]}\nops:\n"
       "  - {op: MatMul, in: [x, router], out: logits}\n  - {op: TopKGate, in: [logits], out: [gw, gi], k: 1}\n"
       "  - {op: MoEDispatch, in: [x, gi, gw], out: buf, axis: ep, buffer: [E, 1048576]}\noutputs:\n  buf: {placement: {ep: S(0)}}\n",
       "is too large"},
      {"bytes live (each tensor under the element limit)",
       "mesh: {tp: 2}\ntensors:\n  x: {shape: [64, 64]}\nops:\n  - {op: Exp, in: [x], out: a}\n  - {op: Exp, in: [a], out: b}\n  - {op: Exp, in: "
       "[b], out: c}\n"
       "  - {op: Exp, in: [c], out: d}\noutputs:\n  a: {}\n  b: {}\n  c: {}\n  d: {}\n",
       "at once"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    OracleResult r = run_small(c.yaml);
    CHECK(r.verdict == OracleVerdict::Skipped);
    CHECK(has(r.message, c.reason));
    CHECK(live_bytes() == 0);  // everything the run held is freed
  }
  // The same programs within the limits run.
  for (int k : {3, 7}) {
    reset_peak_bytes();
    OracleResult ok = run_small(cases[k].yaml, 1 << 20, std::int64_t{64} << 20);
    CHECK_MESSAGE(ok.verdict == OracleVerdict::Agree, ok.message << " peak " << peak_bytes());
  }
  // A local-view program too large to run reports nothing in `check` (the run says why it skipped).
  Program lv = load_program_string(cases[1].yaml, "t.yaml");
  CHECK(check_local_view(lv).empty());
}

TEST_CASE("budget: a run frees what no later op reads") {
  // Five [64, 64] values in a chain, one output: with dead values freed the run needs about two at a time.
  const char* yaml =
      "mesh: {tp: 2}\ntensors:\n  x: {shape: [64, 64]}\nops:\n  - {op: Neg, in: [x], out: a}\n  - {op: Neg, in: [a], out: b}\n"
      "  - {op: Neg, in: [b], out: c}\n  - {op: Neg, in: [c], out: d}\n  - {op: Neg, in: [d], out: e}\noutputs:\n  e: {}\n";
  reset_peak_bytes();
  OracleResult r = run_small(yaml, 1 << 20, std::int64_t{64} << 20);
  CHECK_MESSAGE(r.verdict == OracleVerdict::Agree, r.message);
  // x and one value per run (single-device and two ranks, 256 KiB and 2 x 128 KiB), the next value, a few copies
  CHECK(peak_bytes() < 6 * 64 * 64 * static_cast<std::int64_t>(sizeof(Num)));
}

TEST_CASE("budget: a spec too large to run is value-unproved at the op, never a crash") {
  for (const char* op :
       {"{op: Expand, in: [x], out: big, shape: [1048576, 1048576, 4]}", "{op: Pad, in: [x], out: big, dim: 0, before: 1099511627776}"}) {
    INFO(op);
    std::string yaml =
        std::string("mesh: {tp: 2}\ntensors:\n  x: {shape: [1, 4]}\nops:\n  - {op: Neg, in: [x], out: y}\noutputs:\n  y: {}\nspec:\n  ops:\n    - ") +
        op + "\n    - {op: Neg, in: [x], out: y_s}\n  outputs: {y: y_s}\n";
    EquivResult r = check_equivalence(load_program_string(yaml, "t.yaml"));
    CHECK(r.verdict == EquivVerdict::Skipped);
    REQUIRE(r.diags.size() == 1);
    CHECK(r.diags[0].id == CheckId::ValueUnproved);
    CHECK(r.diags[0].loc.line == 10);  // the spec op that asks for the tensor
    CHECK(has(r.diags[0].message, "is too large for the interpreter"));
    CHECK(live_bytes() == 0);
  }
}

TEST_CASE("budget: recording every value to localize a mismatch is charged too") {
  // The plan adds the bias on every rank before the all-reduce: a mismatch. A trial fits in 1 MiB; recording every
  // op's value on every rank (report_difference) does not, so the mismatch is reported without the place.
  std::string yaml = "mesh: {tp: 4}\ntensors:\n  x: {shape: [64, 32], placement: {tp: S(1)}}\n  b: {shape: [64]}\nops:\n";
  std::string prev = "x";
  for (int i = 0; i < 12; ++i) {
    std::string out = "h" + std::to_string(i);
    yaml += "  - {op: Neg, in: [" + prev + "], out: " + out + "}\n";
    prev = out;
  }
  yaml += "  - {op: Sum, in: [" + prev +
          "], out: part, dims: [1]}\n  - {op: Add, in: [part, b], out: pb}\n  - {op: AllReduce, in: [pb], out: y, axis: tp}\n";
  yaml += "outputs:\n  y: {placement: {tp: R}}\nspec:\n  ops:\n";
  prev = "x";
  for (int i = 0; i < 12; ++i) {
    std::string out = "g" + std::to_string(i);
    yaml += "    - {op: Neg, in: [" + prev + "], out: " + out + "}\n";
    prev = out;
  }
  yaml += "    - {op: Sum, in: [" + prev + "], out: s, dims: [1]}\n    - {op: Add, in: [s, b], out: y_s}\n  outputs: {y: y_s}\n";
  Program p = load_program_string(yaml, "t.yaml");
  EquivOptions roomy;
  EquivResult full = check_equivalence(p, roomy);
  CHECK(full.verdict == EquivVerdict::Mismatch);
  CHECK(has(full.message, "the first plan op that goes wrong"));
  EquivOptions tight;
  tight.max_bytes = std::int64_t{1} << 20;
  EquivResult r = check_equivalence(p, tight);
  CHECK(r.verdict == EquivVerdict::Mismatch);
  CHECK(!has(r.message, "the first plan op that goes wrong"));
  CHECK(live_bytes() == 0);
}

TEST_CASE("budget: spmdcheck equiv on a spec too large to run exits 4 with a located warning") {
  std::ostringstream out, err;
  int code = run_cli({"equiv", std::string(SPMD_SOURCE_DIR) + "/tests/programs/equiv/spec_expand_too_large.yaml"}, out, err);
  CHECK(code == 4);
  CHECK(
      has(out.str(),
          "spec_expand_too_large.yaml:13:7: warning[value-unproved]: equivalence not checked: a tensor of shape [1048576, 1048576, 4] is too large"));
  std::ostringstream out2, err2;
  CHECK(run_cli({"equiv", std::string(SPMD_SOURCE_DIR) + "/tests/programs/equiv/spec_pad_too_large.yaml"}, out2, err2) == 4);
  CHECK(has(out2.str(), "warning[value-unproved]: equivalence not checked: a tensor of shape [1099511627776, 4] is too large"));
}

}  // namespace spmd
