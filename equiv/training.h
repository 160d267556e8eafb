// equiv/training.h - training equivalence: a training program becomes a plan/spec pair of training steps.
//
// training_pair builds the plan's training step (forward, derived or hand-written backward, grad_sync; the same
// step `check --backward` checks) and the spec's (the spec's forward and its derived backward, on one device),
// in one program whose `ops` are the plan's step and whose `spec_ops` are the spec's. Every parameter whose
// gradient the plan writes is compared: `<param>.grad`, read by the placement it has when it reaches the
// optimizer, against the spec's `<param>.grad`. The seed `<loss>.grad` is the same value on every rank (each rank
// seeds its own backward, as PyTorch's loss.backward() does); the step's P(avg) relabels of a mean loss's
// gradients move no data and are left out. Without a spec the model is the plan's own step run on one device. The
// loss is compared too (by the placement of its last write) unless an output already names it.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd::equiv_detail {

// A plan's LossScale that states a normalization (`axis`) on one device: over an axis its input is P(avg) on, each
// rank's average times the scale summed over the axis's N ranks is the average times scale x N; over a P(sum) axis the
// sum times the scale. The ops of `m` at the indices of `typed`'s LossScales (their input types from `st`) multiply
// by that on one device (1 when the scale is 1/N over averages); a symbolic axis size leaves an op as written.
void loss_scales_on_one_device(Program& m, const Program& typed, const SpatialTypes& st);

struct TrainingPair {
  bool ok = false;
  std::string why;               // when not ok: why the gradients cannot be compared
  Program program;               // the pair: ops = the plan's step, spec_ops = the spec's (or none: its own step)
  std::vector<char> pending;     // per NameId: the plan's last write is a pending sum somewhere (never a stage cut)
  std::pair<std::size_t, std::size_t> plan_bwd{0, 0}, spec_bwd{0, 0};  // the ops of each that are a derived backward
  struct Missing {
    NameId param;
    Loc loc;
  };
  std::vector<Missing> missing;  // parameters the spec's loss depends on that no plan gradient reaches
  // The two steps as the type checker typed them (before the relabels were left out): their ops (operands in
  // `program`) and types, for shape reduction's real extents (equiv/reduce.h).
  std::vector<Op> plan_typed, spec_typed;
  SpatialTypes plan_types, spec_types;
  // A pipelined plan (equiv/pipeline.h): what the value check needs to run and localize it.
  struct MicrobatchInput {
    NameId name = -1, source = -1;  // the plan input `name` is part `part` of `parts` of each rank's block of `source`
    int dim = 0;
    std::int64_t part = 0, parts = 1;
    Loc order_loc;           // the schedule's `batch:` entry when its `order:` is not each microbatch its own part
    std::string order_text;  // then what it does ("reads part 2 twice and part 3 never")
  };
  std::vector<MicrobatchInput> microbatches;
  std::vector<int> family;      // per plan op: the op of the one-microbatch step it is an instance of (-1: none)
  std::vector<int> mb;          // per plan op: the microbatch it runs for (-1: none)
  std::vector<char> generated;  // per plan op: made by the lowering (gradient accumulation, merges): never blamed first
  std::vector<char> derived;    // per plan op: part of a derived backward (messages say so)
};

// A parameter gradient a training pair compares: read by the placement `pl` it has when it reaches the optimizer.
struct PairGrad {
  NameId name;
  Placements pl;
  Loc loc;
  std::vector<std::pair<int, std::int64_t>> ranks{};  // read from the ranks with these coordinates only (a stage's); empty: every rank
};

// Each compared gradient an output of the pair `c` (read by its placement, from its ranks) against the spec's of the
// same name.
void add_grad_outputs(Program& c, const std::vector<PairGrad>& grads);
// The pair's last step: the training keys dropped (the pair is a plain plan/spec program), `c` moved into `r`.
void finish_pair(Program& c, TrainingPair& r);

// The spec's side of a training pair: the spec's forward on the declarations (whole tensors), its backward derived on
// one device, seeded with the plan's seed `plan_seed` times `n_copies` (the copies of the loss the plan's ranks
// differentiate) and its parameter gradients divided by it. `t` is the plan's step, whose side tables the pair keeps;
// on success `c` is the pair with `plan_ops` as its ops and "" is returned, else why the spec's step cannot be built.
std::string spec_pair(const Program& p, const Program& t, std::vector<Op> plan_ops, NameId plan_seed, const std::vector<PairGrad>& grads, double n_copies,
                      TrainingPair& r, Program& c);

// A gradient `<x>.grad` that ops [first, end of `ops`) of `t` write again (clipped or unscaled in place by the
// optimizer step) is renamed there `<x>.grad@optimizer` (reads after the write follow), so that `<x>.grad` keeps
// what grad_sync left: the gradient compared. The renamed names in write order.
std::vector<NameId> rename_optimizer_grads(Program& t, std::vector<Op>& ops, std::size_t first);

// Which names ops [first_optim, end) of the step `t` write (the plan's optimizer step).
std::vector<char> optimizer_writes(const Program& t, std::size_t first_optim);

// The optimizer's results as compared outputs of the pair `c`: every declared tensor (a parameter, an fp32 master, an
// optimizer state) that the plan's optimizer (`plan_w`, per NameId) or the spec's writes, and every other name both
// write, each read by the placement of the plan's last write (`last`; a declared tensor the plan never updates: by
// its declared placement, so a spec that updates it differs) on the ranks `ranks` gives (none: every rank).
// Gradients are compared already.
void optimizer_outputs(const Program& p, const std::vector<char>& plan_w, const std::function<const Placements*(NameId)>& last,
                       const std::function<std::vector<std::pair<int, std::int64_t>>(NameId)>& ranks, Program& c);

// `p` has `loss:` and `train: true` (or a hand-written `backward:`). Throws nothing: a backward that cannot be
// derived is a reason (`why`).
TrainingPair training_pair(const Program& p);

// A local-view plan (`view: local`) with a hand-written `backward:` and `grad_sync:` (Megatron's custom autograd
// functions, rank by rank) against its spec's derived backward: the plan's step is its forward, backward and
// grad_sync run on each rank's local arrays, seeded with the same `<loss>.grad` on every rank (loss.backward() on
// each rank); each parameter's gradient the plan writes is read by the parameter's declared placement and compared
// with the spec's gradient of the spec's loss (no copies of the loss: the plan's backward and grad_sync must give
// the spec's gradient itself).
TrainingPair local_training_pair(const Program& p);

}  // namespace spmd::equiv_detail
