// frontends/graph.h - a captured graph as the frontends read it: nodes with their arguments, annotated types and
// the model's source line (an FX GraphModule's print_readable() text or an HLO module, before any mapping).
//
// Both parsers (fx.cpp, hlo.cpp) produce a Graph; lower.cpp maps its nodes to spmdcheck ops through the op tables.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ir/diagnostic.h"

namespace spmd::frontends {

// An input the frontends cannot accept: a malformed line, an unknown op, a relation that cannot be inferred.
// `file` is the file the position is in (a graph, a relation or a mapping file).
struct ImportError : std::runtime_error {
  std::string file;
  Loc loc;
  ImportError(std::string f, Loc l, const std::string& msg) : std::runtime_error(msg), file(std::move(f)), loc(l) {}
};

// A Python literal or reference in an FX call, or an HLO operand / attribute value.
struct PyVal {
  enum class K : std::uint8_t { None, Bool, Int, Float, Str, Name, List, Tuple, Call, Index };
  K k = K::None;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;                   // Str: the text; Name: an identifier or a dotted name; Call: the callee
  std::vector<PyVal> items;        // List / Tuple elements; Call: positional arguments; Index: [base, index]
  std::vector<std::pair<std::string, PyVal>> kw;  // Call: keyword arguments
  std::string expr;                // an Int that differs between ranks: its value as a size expression of axis_index
  Loc loc;

  bool is_num() const { return k == K::Int || k == K::Float || k == K::Bool; }
  double num() const { return k == K::Float ? f : k == K::Bool ? (b ? 1.0 : 0.0) : static_cast<double>(i); }
  bool is_seq() const { return k == K::List || k == K::Tuple; }

  // Declared here and defaulted below, where std::pair<std::string, PyVal> is complete (clang with libstdc++
  // would otherwise instantiate the pair inside this class).
  PyVal();
  PyVal(const PyVal&);
  PyVal(PyVal&&) noexcept;
  PyVal& operator=(const PyVal&);
  PyVal& operator=(PyVal&&) noexcept;
  ~PyVal();
};
inline PyVal::PyVal() = default;
inline PyVal::PyVal(const PyVal&) = default;
inline PyVal::PyVal(PyVal&&) noexcept = default;
inline PyVal& PyVal::operator=(const PyVal&) = default;
inline PyVal& PyVal::operator=(PyVal&&) noexcept = default;
inline PyVal::~PyVal() = default;

struct TensorType {
  std::string dtype;               // spmdcheck's dtype name (f32, bf16, i64, bool, ...)
  std::vector<std::int64_t> shape;
  std::string symbolic{};          // a dim that is not a number (u0, s0: a data-dependent or dynamic shape), else empty
};

// Where a node came from in the model: `# File: path:line in fn, code: ...` (FX) or metadata (HLO).
struct Origin {
  std::string file;
  std::uint32_t line = 0;
  std::string code;
};

struct Node {
  std::string name;                // its SSA name
  std::string target;              // aten.mm.default (FX, without torch.ops.), getitem, self.<attr>; hlo ops: dot, add, ...
  std::vector<PyVal> args;
  std::vector<std::pair<std::string, PyVal>> kwargs;
  std::optional<TensorType> type;  // the annotation, when the dump has one
  std::vector<TensorType> tuple;   // HLO: a tuple-typed result's element types
  Loc loc;                         // in the graph file
  Origin origin;
  const PyVal* kwarg(const std::string& k) const {
    for (const auto& [n, v] : kwargs)
      if (n == k) return &v;
    return nullptr;
  }
};

struct Graph {
  std::string file;
  std::string format;              // "fx" or "hlo"
  std::vector<Node> inputs;        // placeholders (FX) or parameters (HLO), in order
  std::vector<Node> nodes;
  std::vector<PyVal> outputs;      // returned values (Name references, None for absent ones)
  Loc return_loc;
  std::vector<std::vector<std::int64_t>> replica_groups;  // HLO: the device groups its collectives name
  std::int64_t devices = 0;        // HLO: the header's replica_count / num_partitions (0: not given)
};

// Parses the text of GraphModule.print_readable() (TORCH_LOGS=aot_graphs, tlparse, torch.compile debug dumps).
Graph parse_fx(const std::string& text, const std::string& file);
// Parses HLO module text (as_text(), XLA dumps): the ENTRY computation, reducers by their root op.
Graph parse_hlo(const std::string& text, const std::string& file);

// "f32" for FX's f32/b8/i64..., HLO's f32/pred/s32...; empty when unknown.
std::string fx_dtype(const std::string& s);
std::string hlo_dtype(const std::string& s);

}  // namespace spmd::frontends
