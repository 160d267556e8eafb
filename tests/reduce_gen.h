// tests/reduce_gen.h - random programs with named sizes, one family per seed at several scales (issue 20).
//
// The differential test of shape reduction (spmd_equiv_difftest --reduce N) needs the same program at several sizes:
// generate_scaled draws, from `seed`, a global-view plan and its single-device spec over named sizes (B, S, H, F, NH,
// D, V) on a 1-D or 2-D mesh (axes of 2 or 4 ranks, which a mesh reduction runs at 2) - tensor-parallel MLPs with biases, RMSNorm/LayerNorm, a mean over a sequence sharded
// over cp with its 1/S written as a number, attention written out with its 1/sqrt(D) as a number against
// FlashAttention's own scale, a vocab-parallel cross-entropy normalized by a written token count, RoPE at global
// positions - and writes it at `scale` times the base sizes. Numbers that depend on sizes are computed from that
// scale's sizes, as a user writes them for the sizes they train with. About half the families carry one mistake
// (`mistake` names it), the same at every scale: a 1/S that forgets the cp factor, a scale that is right only at
// small sizes (1/2, 1/4), a bias added before its AllReduce, a doubled attention scale, local positions, an
// AllReduce that averages.
#pragma once
#include <cstdint>
#include <string>

namespace spmd::test {

struct ScaledProgram {
  std::string text;     // the YAML program with its spec
  std::string mistake;  // "" when the plan is meant to equal the spec
};

ScaledProgram generate_scaled(std::uint64_t seed, int scale);

}  // namespace spmd::test
