// autograd/loss_scaling.h - pieces of the training step's loss-scaling findings (private to autograd/): what a
// failed relabel says about a gradient, the scale grad_sync applies to it, and the words of the findings.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd {

// A parameter gradient that is not a pending sum over an axis the loss is a per-rank mean (or replicated)
// over: `have` is its placement there, so it is N times the gradient of the loss.
struct FoldedGrad {
  std::string grad, have;
  int axis;
};

// The type of a name's last version among the first `n_ops` ops of p (or its declaration).
ValueType final_type(const Program& p, const SpatialTypes& ty, NameId n, std::size_t n_ops);
// "dp and tp"; as an `axis:` attribute, "[dp, tp]" or "tp".
std::string axis_list(const Program& p, std::uint32_t m, const char* sep = " and ");
std::string axis_attr(const Program& p, std::uint32_t m);
// 1 / (the product of the sizes of `axes`): a number when they are concrete, else "1/(dp*tp)".
std::string scale_text(const Program& t, std::uint32_t axes);
// "w1.grad (S(1) over that axis) and w2.grad (S(0) over that axis)".
std::string grads_text(const std::vector<FoldedGrad>& f);
// The constant factor the grad_sync ops of step t (ops [first_sync, end)) apply to gradient g on its way to
// the optimizer (which reads g's last version): scalar Multiply / Div and LossScale; collectives and
// conversions move data and are typed. nullopt when another op touches it.
std::optional<double> sync_scale(const Program& t, std::size_t first_sync, std::size_t end, NameId g);
// The replicated (R over one of `axes`) floating-point values that forward ops after op w combine with values
// computed from w's output: with `dst: I` on w those values become I there, and an R operand beside them would
// be invariant-mix. Empty when the single edit is the whole fix.
std::vector<std::string> replicated_after(const Program& p, const SpatialTypes& ft, std::size_t n_ops, int w, std::uint32_t axes);

}  // namespace spmd
