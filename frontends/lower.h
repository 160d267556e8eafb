// frontends/lower.h - from a captured graph to spmdcheck ops: the context an op-table row sees, and the tables.
//
// Each imported op is one row of a table (aten_ops.cpp for FX, hlo_ops.cpp for HLO, a mapping file for custom
// ops): the op's parameter list and a short emitter that writes the IR op (or a short decomposition) and states
// the result's shape, which is checked against the graph's annotation. lower_graph walks the nodes the compared
// outputs need (plus every collective), looks each up in the tables, and gives a located error for one it lacks.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "frontends/graph.h"

namespace spmd::frontends {

// What a graph name stands for once lowered.
struct Value {
  std::string ir;                          // the IR tensor name; empty: not a tensor
  TensorType type;
  bool is_tuple = false;                   // a tuple-valued node: read by getitem
  std::optional<double> scalar;            // a constant 0-d tensor's value (a lifted constant, full([], v))
  std::string handle;                      // an async collective's result that no wait_tensor completed yet
  bool arange0 = false;                    // arange(0, n): an index that picks every row in order
  std::optional<std::int64_t> int_value;   // a Python int (aten.sym_size)
  std::vector<std::string> bases;          // auto_functionalized: the mutated bases, in order
};

// One spmdcheck op, written as a YAML flow mapping.
struct EOp {
  std::string op;
  std::vector<std::string> in, out;
  std::vector<std::pair<std::string, std::string>> attrs;  // name -> YAML text
  std::string at;                                           // the `at:` origin
};

class CustomOps;  // custom_ops.h

struct LowerOptions {
  std::string prefix;                                  // prepended to every non-input name (the spec's: "seq_")
  std::map<std::string, std::string> groups;           // process group name (FX) or replica group (HLO) -> mesh axis
  std::string default_axis;                            // when `groups` does not name a group; empty: an error
  std::map<std::string, double> constants;             // lifted tensor constants (`self._tensor_constant0`) by name
  std::optional<double> default_constant;
  const CustomOps* custom = nullptr;
  std::vector<std::string> roots;                      // the graph outputs to compute (names)
  std::map<std::string, std::string> input_ir;         // graph inputs named otherwise in the program (default: their own name)
  bool local_view = false;                             // the plan of a local-view program (rank-varying ints allowed)
  bool keep_collectives = true;                        // every collective is kept, needed or not (temporal checks)
  std::string graph_label;                             // the graph file as shown in `at:`
};

class Lowering;

// A literal that differs between the ranks' graphs where the row needs one value for every rank: the local-view
// plan cannot carry it, so the importer writes per-rank programs instead.
struct RankVarying : ImportError {
  using ImportError::ImportError;
};

// A row's view of one node: its bound parameters, its results, and the ops it emits.
class Ctx {
 public:
  Ctx(Lowering& l, const Node& n, std::string_view params);

  const Node& node() const { return n_; }
  // ---- parameters -------------------------------------------------------------------------------
  bool is_param(std::string_view p) const;            // the row has a parameter of that name
  bool has(std::string_view p) const;                 // given and not None
  const PyVal& v(std::string_view p) const;           // the raw argument
  const Value& T(std::string_view p) const;           // a tensor argument
  std::optional<double> constant(std::string_view p) const;  // a lifted constant's value (never materialized)
  const Node* producer(const PyVal& x) const;         // the graph node writing x (null for inputs and literals)
  bool is_tensor(std::string_view p) const;
  std::string t(std::string_view p) const { return T(p).ir; }
  const TensorType& ty(std::string_view p) const { return T(p).type; }
  std::int64_t I(std::string_view p) const;           // an int (the same on every rank)
  double F(std::string_view p) const;                 // a number
  std::vector<std::int64_t> Is(std::string_view p) const;  // an int or a list of ints
  std::string S(std::string_view p) const;            // a string
  std::string size(std::string_view p) const;         // an int as a size expression (may use axis_index)
  int dim(std::string_view p, std::size_t rank) const;  // a dim, normalized to [0, rank)
  const Value& tensor_at(const PyVal& x) const;       // a tensor referenced inside a list argument
  // ---- results ---------------------------------------------------------------------------------
  std::string out(std::size_t k = 0);                 // the IR name of result k
  bool needs(std::size_t k) const;                    // result k of a tuple is read
  std::size_t n_results() const;
  const TensorType* annotated(std::size_t k = 0) const;  // the graph's type of result k, if it has one
  // States result k's type; a contradicting annotation is a located error.
  void result(std::size_t k, TensorType t);
  void result(TensorType t) { result(0, std::move(t)); }
  void alias(std::size_t k, const Value& v);          // result k is that value (no op)
  void set_scalar(std::size_t k, double x);
  void set_handle(std::size_t k, const std::string& h);
  void set_arange0(std::size_t k);
  void set_int(std::size_t k, std::int64_t x);
  void set_bases(std::vector<std::string> b);
  // ---- emission --------------------------------------------------------------------------------
  std::string tmp(std::string_view hint = "t");
  void emit(std::string op, std::vector<std::string> in, std::vector<std::string> out, std::vector<std::pair<std::string, std::string>> attrs = {});
  // A tensor holding scalar argument p (a Full, or for a rank-varying int an Arange of one element).
  std::string scalar_tensor(std::string_view p, const std::string& dtype);
  std::string full(const std::vector<std::int64_t>& shape, double value, const std::string& dtype);
  std::string axis_of_group(const PyVal& group) const;
  bool local_view() const;
  const CustomOps* custom() const;
  [[noreturn]] void fail(const std::string& msg) const;
  [[noreturn]] void rank_varying(const std::string& msg) const;  // RankVarying: fall back to per-rank programs
  [[noreturn]] void fail_at(const PyVal& at, const std::string& msg) const;

 private:
  const PyVal* find(std::string_view p) const;
  Lowering& l_;
  const Node& n_;
  std::vector<std::pair<std::string, const PyVal*>> bound_;
  std::vector<PyVal> defaults_;
};

using Emit = std::function<void(Ctx&)>;
struct Row {
  std::string_view target;  // aten.mm.default, _c10d_functional.all_reduce.default; HLO: dot, add, ...
  std::string_view params;  // "self, mat2" / "self, other, *, alpha=1": positional names, defaults after '='; "**": any keyword
  Emit emit;
};
std::span<const Row> aten_rows();
std::span<const Row> hlo_rows();

// The lowered graph: its ops, and for each graph output the IR name and type.
struct Lowered {
  std::vector<EOp> ops;
  std::map<std::string, Value> values;  // graph name -> value (outputs and inputs)
  std::set<std::string> skipped;        // targets of nodes no compared output needs (not imported)
};

Lowered lower_graph(const Graph& g, const LowerOptions& o);

// Shape helpers shared by the tables.
std::vector<std::int64_t> broadcast_shape(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b, const Ctx& c);
std::string shape_text(const std::vector<std::int64_t>& s);
std::string ints_text(const std::vector<std::int64_t>& s);
std::string num_text(double x);
std::string type_text(const TensorType& t);

}  // namespace spmd::frontends
