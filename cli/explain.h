// cli/explain.h - `spmdcheck explain`: every value's global shape, placement per axis, local shape and why.
//
// explain_program walks the ops in order (per rank program), binding each input to the value that
// defines it, and builds for every value and every axis that is not R the chain that explains its
// placement: declared here, kept through these ops, arose at this op because ... (the rule's own
// words, from the spatial checker's origin trace). explain_text prints it; the report reuses it.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/program.h"
#include "spatial/spatial.h"

namespace spmd {

struct ValueRef {
  int op = -1;  // -1: the declaration `k`
  int k = 0;    // declaration index, or output index of `op`
};

// One step of a placement's explanation: this value's part, and the input it kept the placement from (whose own
// explanation continues the chain), if any.
struct WhyStep {
  std::string text;   // "a S(1) via GELU (line 5)" (in ExplainValue::why_step: the axis and placement, "tp S(1)")
  std::string brief;  // without the value and placement: "via GELU (line 5)", "arose at MatMul (line 7) from ...: why"
  std::optional<ValueRef> from;
  std::string from_name;
};

struct ExplainValue {
  std::string name;
  ValueRef ref;
  const ValueType* type = nullptr;  // into the SpatialTypes given
  std::vector<std::string> why;     // one line per axis that is not R: how the placement arose (the whole chain)
  std::vector<WhyStep> why_step;    // the same axes: only this value's step, for the report (which links `from` to its row)
};

struct ExplainOp {
  int op = 0;
  std::vector<std::string> ins;
  std::vector<ValueRef> in_refs;  // op -2: undefined
  std::vector<ExplainValue> outs;
};

struct Explanation {
  std::vector<ExplainValue> decls;
  std::vector<ExplainOp> ops;
};

Explanation explain_program(const Program& p, const SpatialTypes& types);

struct ExplainFilter {
  std::optional<int> op;       // --op N: only this op
  std::string tensor;          // --tensor NAME: this tensor's values and the picture of its last one
};

// The explanation as text (`file` labels it; `diags` are shown under the op they belong to). Throws
// LoadError when the filter names an op or tensor the program lacks.
std::string explain_text(const std::string& file, const Program& p, const SpatialTypes& types, const Explanation& e,
                         const std::vector<Diagnostic>& diags, const ExplainFilter& filter, bool color);

}  // namespace spmd
