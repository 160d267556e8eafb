// tests/equiv_train.h - random global-view training programs with a spec, and an independent ground truth for
// their gradients (the differential test of training equivalence, `spmd_equiv_difftest --train N`).
//
// generate_train(seed, bug) draws a small layer stack (column/row-parallel and replicated linears, biases, gains,
// squares, scales, residuals, Concat, Slice, Reshape, sequence-parallel regions, tied weights; Exp, SiLU, GELU,
// Sqrt, Rsqrt, Log, RMSNorm, LayerNorm, Softmax, FlashAttention with its cp form) over a 1-3 axis mesh (dp, cp, tp), a scalar loss (Mean
// or Sum, or a CrossEntropyLoss, vocab-parallel sometimes; left P over dp/cp as DDP does, all-reduced, or normalized by LossScale) and its spec. The same seed with bug = false and bug = true gives
// the same program except for the injected mistake (`mistake` names it). The grad_sync is the one the type checker asks for (its unsynced-gradient
// fixes), optionally in DeepSpeed's pre-divide form; grad_sync mistakes are applied to it.
//
// gradient_truth runs the plan's training step per rank (its derived backward and grad_sync, every rank seeding
// its backward with 1 as loss.backward() does), reads each parameter's gradient by the parameter's declared
// placement, and compares it with central finite differences (Richardson-extrapolated) of the spec's forward
// loss in doubles, one parameter element at a time; the plan's loss output is compared with the spec's too.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "interp/assembly.h"
#include "ir/diagnostic.h"
#include "ir/program.h"

namespace spmd::test {

struct TrainCase {
  std::string forward;             // the YAML program without grad_sync (train: true)
  std::string mistake;             // "" when none
  bool grad_sync_mistake = false;  // the mistake is applied to the grad_sync (by with_grad_sync)
  bool predivide = false;          // write grad_sync as DeepSpeed's pre-divide / all-reduce / post-multiply
  int variant = 0;                 // which grad_sync mistake
  // The optimizer step after grad_sync (drawn from its own stream, so the rest of the program is as without it):
  // 0 none, 1 SGD with momentum, 2 AdamW; with global-norm clipping or not; the optimizer mistake (-1: none).
  int optim = 0;
  bool clip = false;
  int optim_mistake = -1;
};

TrainCase generate_train(std::uint64_t seed, bool bug);

// The grad_sync block for `forward` from the type checker's unsynced-gradient fixes (with the case's grad_sync
// mistake when `bug`); false when the forward has other errors (`why` says which).
bool with_grad_sync(const TrainCase& c, bool bug, std::string& text, std::string& why);

// The optimizer step of `c` (c.optim: SGD with momentum or AdamW on every parameter, after global-norm clipping or
// not) and its spec, added to the program text `text` (with its grad_sync); the case's optimizer mistake when `bug`.
// False when the mistake has nothing to apply to (tests/equiv_train_optim.cpp).
bool with_optimizer(const TrainCase& c, bool bug, std::string& text);

// The errors `spmdcheck check` reports before the value check (spatial, temporal, training step).
std::vector<Diagnostic> type_errors(const Program& p);

struct Truth {
  bool differs = false;  // some gradient (or the loss) differs from the finite differences
  bool failed = false;   // the plan's step or the spec's forward cannot be run
  std::string what;
  int compared = 0;  // parameter elements compared
};

// `max_elements` > 0: compare at most that many elements of each gradient, spread evenly.
Truth gradient_truth(const Program& p, std::size_t max_elements = 0);

// The comparison of gradient_truth, for any plan that has run: `plan_value` reads a plan value by a placement (the
// plan's loss by its output's, each parameter's gradient `<param>.grad` of `t` by the parameter's), against the
// spec's forward loss of `p` on the global `inputs` and its central finite differences.
Truth compare_with_spec(const Program& p, const Program& t, const interp::Instantiation& inst, const std::vector<std::pair<NameId, interp::Tensor>>& inputs,
                        const std::function<interp::Tensor(NameId, const Placements&, std::string&)>& plan_value, std::size_t max_elements);

// The spec's optimizer step against the plan's (tests/equiv_train_optim.cpp): evaluated in doubles on the global
// `inputs` and the finite-difference gradients `fd_grads`; sets tr.differs when an updated tensor differs.
void optimizer_truth(const Program& p, const std::vector<std::pair<NameId, interp::Tensor>>& inputs, const std::map<NameId, std::vector<double>>& fd_grads,
                     const std::function<interp::Tensor(NameId, const Placements&, std::string&)>& plan_value, Truth& tr);

}  // namespace spmd::test
