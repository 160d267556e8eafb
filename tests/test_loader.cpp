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
  CHECK(load_error("mesh: {tp: 2}\nprograms: []\n", &l).find("not supported yet") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-misuse, shape-mismatch]\n").empty());
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-mis]\n").find("did you mean 'partial-misuse'?") != std::string::npos);
  // Deep nesting is refused by the parser, not by a stack overflow.
  CHECK_FALSE(load_error("mesh: {tp: 2}\nops: " + std::string(100000, '[') + "\n", &l).empty());
}
