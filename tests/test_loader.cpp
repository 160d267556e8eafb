// tests/test_loader.cpp - located errors for malformed programs (the corpus in tests/bad_input covers more).
#include <doctest/doctest.h>

#include "tests/helpers.h"

using namespace spmd;
using namespace spmd::test;

TEST_CASE("load errors are located and suggest names") {
  Loc l;
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: Matmul, in: [a, b], out: c}\n", &l).find("did you mean 'MatMul'?") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(l.col == 10);
  CHECK(load_error("mesh: {tp: 2}\nopz: []\n", &l).find("did you mean 'ops'?") != std::string::npos);
  CHECK(l.line == 2);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllGather, in: [a], out: b, axis: tp, dimm: 0}\n", &l).find("did you mean 'dim'?") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllGather, in: [a], out: b, axis: tp}\n", &l).find("needs attribute `dim`") != std::string::npos);
  // An axis the mesh lacks is an illegal-collective finding (contract section 3), not a load error.
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllReduce, in: [a], out: b, axis: pt}\n").empty());
  auto bad_axis = diags("mesh: {tp: 2}\ntensors:\n  a: {shape: [4], placement: {tp: P}}\nops:\n  - {op: AllReduce, in: [a], out: b, axis: pt}\n");
  REQUIRE(bad_axis.size() == 1);
  CHECK(check_name(bad_axis[0].id) == "illegal-collective");
  CHECK(bad_axis[0].message.find("did you mean 'tp'?") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: S(2)}}\nops: []\n", &l).find("out of range") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(load_error("mesh: {tp: 0}\nops: []\n", &l).find("positive") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [1099511627777]}\nops: []\n", &l).find("too large") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [1099511627776, 1099511627776]}\nops: []\n", &l).find("too many elements") !=
        std::string::npos);
  CHECK(load_error("mesh: {tp: 2\nops: []\n", &l).find("invalid YAML") != std::string::npos);
  CHECK(load_error("", &l).find("empty program") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: RingAttention, in: [q, k, v], out: o, axis: tp}\n", &l).find("not supported yet") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nprograms: []\n", &l).find("non-empty list") != std::string::npos);
  CHECK(load_error("mesh: {pp: 2}\nschedule: {kind: GPipe, microbatches: 2}\nops: []\n", &l).find("instead of `ops`") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntrain: true\nops: []\n", &l).find("loss") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-misuse, shape-mismatch]\n").empty());
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-mis]\n").find("did you mean 'partial-misuse'?") != std::string::npos);
  // Deep nesting is refused by the parser, not by a stack overflow.
  CHECK_FALSE(load_error("mesh: {tp: 2}\nops: " + std::string(100000, '[') + "\n", &l).empty());
}

TEST_CASE("hostile inputs get located errors, never a crash or a hang") {
  Loc l;
  // 150,000 chained subtractions: bounded depth, not a stack overflow.
  std::string chain = "mesh: {tp: 1}\nsizes: {H: {max: 2}}\ntensors: {x: {shape: [H";
  for (int i = 0; i < 150000; ++i) chain += "-1";
  chain += "]}}\nops: []\n";
  CHECK(load_error(chain, &l).find("too large") != std::string::npos);
  CHECK(l.line == 3);
  // Named sizes that multiply out exponentially: bounded size, not an exponential walk.
  std::string blowup = "mesh: {tp: 1}\nsizes:\n  A: {max: 2}\n";
  const char* names = "ABCDEFGHIJK";
  for (int i = 1; i < 11; ++i) {
    blowup += std::string("  ") + names[i] + ": ";
    for (int k = 0; k < 10; ++k) blowup += std::string(k ? "*" : "") + names[i - 1];
    blowup += "\n";
  }
  blowup += "tensors: {x: {shape: [K]}}\nops: []\n";
  CHECK(load_error(blowup).find("too large") != std::string::npos);
  // A mesh of 2^80 ranks.
  CHECK(load_error("mesh: {a: 1048576, b: 1048576, c: 1048576, d: 1048576}\nops: []\n").find("more than 2^31 ranks") != std::string::npos);
  // Did-you-mean on huge names stays cheap.
  std::string long_axis(20000, 'a'), long_typo(20000, 'b');
  CHECK(load_error("mesh:\n  ? " + long_axis + "\n  : 2\ntensors:\n  x:\n    shape: [4]\n    placement:\n      ? " + long_typo + "\n      : S(0)\nops: []\n")
            .find("which the mesh lacks") != std::string::npos);
  // Multiplying by zero is a zero dim.
  CHECK(load_error("mesh: {tp: 1}\nsizes: {H: {min: 1}}\ntensors: {x: {shape: [0*H]}}\nops: []\n").find("positive") != std::string::npos);
  // A second YAML document and an unclosed quote.
  CHECK(load_error("mesh: {tp: 2}\nops: []\n---\nmesh: {tp: 4}\n", &l).find("one YAML document") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(load_error("# a comment\n---\nmesh: {tp: 2}\nops: []\n---\nmesh: {tp: 4}\n", &l).find("one YAML document") != std::string::npos);
  CHECK(l.line == 5);  // a leading document marker is not the second document
  CHECK(load_error("mesh: {tp: 2}\nname: \"oops\nops: []\n", &l).find("never closed") != std::string::npos);
  CHECK(l.line == 2);
}

TEST_CASE("products of symbolic sizes are proved without the solver timing out") {
  // B*S with B a multiple of 8 is even for every value; Z3's nonlinear arithmetic alone gives up here.
  CHECK(ids("mesh: {tp: 2}\nsizes: {B: {min: 8, multiple_of: 8}, S: {min: 128, multiple_of: 128}}\n"
            "tensors:\n  a: {shape: [B*S, 64], placement: {tp: S(0)}}\nops: []\n")
            .empty());
  CHECK(ids("mesh: {tp: 16}\nsizes: {B: {min: 8, multiple_of: 8}, S: {min: 1}}\n"
            "tensors:\n  a: {shape: [B*S, 64], placement: {tp: S(0)}}\nops: []\n") == std::set<std::string>{"shape-mismatch"});
}
