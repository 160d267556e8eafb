// tests/local_train_gen.h - random local-view training steps with a hand-written backward, for the differential run
// (spmd_equiv_difftest --local-train N): Megatron's tensor-parallel MLP blocks with their f/g operators, data parallel
// or not, a mean or sum loss, and at most one mistake a hand-written backward makes.
#pragma once
#include <cstdint>
#include <string>

namespace spmd::test {

struct LocalTrainProgram {
  std::string text;     // the YAML program: the local-view forward, `backward:`, `grad_sync:`, and the spec
  std::string mistake;  // the injected mistake ("" when none)
};

LocalTrainProgram generate_local_train(std::uint64_t seed);

}  // namespace spmd::test
