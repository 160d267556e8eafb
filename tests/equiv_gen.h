// tests/equiv_gen.h - random local-view plan/spec pairs for the differential test of the value check (issue 11).
//
// generate_local_pair draws a small single-device spec (a chain of MatMul, Add, scalar Multiply, GELU/SiLU, Softmax,
// Sum/Mean, Slice, Concat, Transpose, Reshape over small concrete sizes) and derives a `view: local` plan from it by
// a random sharding strategy per op on a 1-D or 2-D mesh (column/row-parallel matmuls, AllReduce, ReduceScatter,
// AllGather, axis_index slices, sharded reductions with their 1/n scale). With some probability it injects ONE
// realistic mistake; `mistake` names it (empty: the plan is meant to be right).
#pragma once
#include <cstdint>
#include <string>

namespace spmd::test {

struct LocalPair {
  std::string text;     // the YAML program: tensors, the local-view plan, outputs, spec
  std::string mistake;  // the injected mistake ("" when none)
  // The same plan as per-rank `programs:` (one program per rank, each `axis_index(a)` replaced by the rank's
  // coordinate): the same values, so the value check must give it the same verdict.
  std::string per_rank;
};

LocalPair generate_local_pair(std::uint64_t seed);

}  // namespace spmd::test
