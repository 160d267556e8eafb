// equiv/choices.cpp - what a verdict covers: the choices by value in a plan and its spec (MoE routing, max and min
// reductions, inputs pending a max or min, FP8 amax history) and the drawn inputs an `equivalent` holds for.
#include <algorithm>
#include <string>
#include <vector>

#include "equiv/equiv_impl.h"

namespace spmd::equiv_detail {

namespace {

// A max or min reduction (an op or a collective): its result is the operand the values choose.
bool extreme_op(const Op& op) {
  return op.kind == OpKind::ReduceMax || op.kind == OpKind::ReduceMin ||
         (op_info(op.kind).category == OpCategory::collective && (op.attrs.rop == ReduceOp::Max || op.attrs.rop == ReduceOp::Min));
}
// An input pending a max or min: its global value is the largest (smallest) summand, chosen by value.
bool pending_extreme(const TensorDecl& t) {
  return std::any_of(t.placement.begin(), t.placement.end(), [](Placement pl) { return pl.is_p() && (pl.op == ReduceOp::Max || pl.op == ReduceOp::Min); });
}

}  // namespace

// What an `equivalent` verdict covers beyond the real inputs: the drawn integer inputs and dropout masks.
std::string scope_text(const Program& p) {
  std::vector<std::string> parts;
  std::string ints;
  for (const auto& t : p.tensors)  // (a pipeline's microbatch inputs, `ids@mb3`, are parts of the ones named)
    if (is_int(t.dtype) && p.name(t.name).find("@mb") == std::string::npos) ints += (ints.empty() ? "" : ", ") + p.name(t.name);
  if (!ints.empty()) parts.push_back("the drawn integer inputs (" + ints + ")");
  // Value-dependent choices never reach `equivalent` (value_choice); what is left is Dropout's seeded masks.
  bool dropout = false;
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list) dropout |= op.kind == OpKind::Dropout;
  if (dropout) parts.push_back("the drawn dropout masks");
  if (parts.empty()) return "";
  std::string s = ", for ";
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? " and " : "") + parts[i];
  return s;
}

// Whether op `k` is MoE routing: TopKGate picks each token's experts by value, MoEDispatch fills capacity slots by
// those indices.
bool is_routing(OpKind k) { return k == OpKind::TopKGate || k == OpKind::MoEDispatch; }

// The first op of the plan or the spec whose result depends on a choice made by comparing values (routing, a
// max/min reduction, an input pending a max or min), or null. A comparison, a count or a cast to integers is a
// choice only on data that is not an exact constant: the runs report that (Runner::inexact_choice).
// `sets`: max and min reductions read as functions of sets (interp/num.h, set_extreme) are no choice.
const Op* value_choice(const Program& p, bool sets) {
  // an input pending a max or min: its global value is the largest (smallest) summand, chosen by value; the first
  // op that reads it stands for the choice
  for (const auto& t : p.tensors) {
    if (sets) break;
    if (pending_extreme(t))
      for (const auto& op : p.ops) {
        auto ins = p.ins(op);
        if (std::find(ins.begin(), ins.end(), t.name) != ins.end()) return &op;
      }
  }
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list)
      if ((extreme_op(op) && !sets) || is_routing(op.kind) || op.kind == OpKind::AmaxUpdate || op.kind == OpKind::AmaxHistory) return &op;
  return nullptr;
}

// Whether the plan's and the spec's static choices by value (value_choice) are all MoE routing, at least one. With the
// experts each token chose held fixed, the plan and the spec are rational functions the lanes prove equal: equal
// for every input that routes its tokens as a drawn input did, and only those (no other choice may remain).
bool routing_only(const Program& p) {
  if (std::any_of(p.tensors.begin(), p.tensors.end(), pending_extreme)) return false;
  bool routing = false;
  for (const auto* list : {&p.ops, &p.spec_ops})
    for (const auto& op : *list) {
      if (extreme_op(op) || op.kind == OpKind::AmaxUpdate || op.kind == OpKind::AmaxHistory) return false;
      routing |= is_routing(op.kind);
    }
  return routing;
}

}  // namespace spmd::equiv_detail
