// ir/program.h - a parsed SPMD program: mesh, sizes, tensor declarations, ops and outputs.
//
// Names are interned (NameId); op operands live in one flat array; attributes sit inline in each
// op, with list-valued ones in side tables. This keeps a million-op program compact.
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/diagnostic.h"
#include "ir/expr.h"
#include "ir/op_table.h"
#include "ir/placement.h"

namespace spmd {

inline constexpr int kMaxAxes = 8;     // mesh axes
inline constexpr int kMaxRank = 8;     // tensor dims
inline constexpr std::size_t kMaxOps = 10'000'000;

using NameId = std::int32_t;
inline constexpr std::uint32_t kNoIndex = std::numeric_limits<std::uint32_t>::max();
inline constexpr std::int16_t kUnset = std::numeric_limits<std::int16_t>::min();
inline constexpr std::uint8_t kNoChoice = 0xFF;

enum class DType : std::uint8_t { F32, F64, BF16, F16, FP8E4M3, FP8E5M2, I64, I32, I8, Bool };
std::string_view dtype_name(DType d);
bool parse_dtype(std::string_view s, DType& out);
std::vector<std::string> dtype_names();

using Placements = std::array<Placement, kMaxAxes>;

// A hash for string keys that also finds by std::string_view (no string built for a lookup).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Name -> NameId, open addressing: the keys' bytes in one arena, 16-byte slots (hash, offset, length, id), so a
// million names cost two flat arrays, not a node and a string each. Finds by string_view; copies stay valid
// (offsets, not pointers). The interface is the part of std::unordered_map the code uses.
class NameTable {
 public:
  struct Entry {
    std::uint32_t hash, off, len;
    NameId id;
  };
  // What find gives: `it->first` the key, `it->second` the id; compares equal to end() when absent.
  struct Found {
    std::string first;  // a copy: finds are rare (interning uses find_or_insert)
    NameId second = -1;
  };
  class Iter {
   public:
    Iter() = default;
    explicit Iter(Found f) : f_(std::move(f)), ok_(true) {}
    const Found* operator->() const { return &f_; }
    const Found& operator*() const { return f_; }
    bool operator==(const Iter& o) const { return ok_ == o.ok_ && (!ok_ || f_.second == o.f_.second); }

   private:
    Found f_;
    bool ok_ = false;
  };
  Iter find(std::string_view key) const;
  Iter end() const { return {}; }
  std::size_t count(std::string_view key) const { return find(key) == end() ? 0 : 1; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void reserve(std::size_t n);
  // The id of `key`; absent, `key` is added with `id` (then the result is `id`).
  NameId find_or_insert(std::string_view key, NameId id);
  // Makes room for `n` more keys and starts loading the slots of `keys` into the cache (the table is larger than
  // the cache at a million names: the misses of an op's few names then overlap instead of following each other).
  void prefetch(std::span<const std::string_view> keys);
  void clear();

 private:
  static std::uint32_t hash_of(std::string_view key);
  const Entry* find_entry(std::string_view key, std::uint32_t h) const;
  void grow(std::size_t slots);
  std::vector<Entry> slots_;  // len == kEmpty: free; size a power of two, at most 7/8 full
  std::string chars_;
  std::size_t size_ = 0;
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
};

struct MeshAxis {
  std::string name;
  ExprId size;
  Loc loc;
};

struct TensorDecl {
  NameId name;
  Loc loc, shape_loc, placement_loc;
  std::vector<ExprId> shape;
  std::vector<Loc> dim_locs;
  DType dtype = DType::F32;
  Placements placement{};
  bool param = false;
  bool uneven = false;
};

struct OutputDecl {
  NameId name;
  Loc loc;
  bool has_placement = false;  // absent: R on every axis
  Placements placement{};
  std::vector<ExprId> shape;   // empty with has_shape false: not checked
  bool has_shape = false;
  // `ranks: {pp: 3}`: the value is read from the ranks with these coordinates only (an output computed on some
  // ranks, e.g. the last pipeline stage); empty: from every rank.
  std::vector<std::pair<int, std::int64_t>> ranks;
};

enum class Reduction : std::uint8_t { Mean, Sum, None };
enum class AttnLayout : std::uint8_t { BHSD, BSHD, SBHD };

struct OpAttrs {
  std::uint32_t axes = 0;              // `axis`: bitmask over mesh axes (0 = not given)
  std::int16_t dim = kUnset;           // dim | split_dim | src/dst-free int attributes
  std::int16_t dim2 = kUnset;          // concat_dim
  std::int32_t rank = -1;              // src / dst rank index along the axis
  std::int32_t k = 0;                  // TopKGate k; RingAttentionStep `step`
  std::uint32_t dims = kNoIndex;       // `dims`: index into Program::int_lists
  std::uint32_t shape = kNoIndex;      // `shape`: index into Program::shapes
  std::uint32_t placements = kNoIndex; // `placement` map: index into Program::placement_maps
  std::uint32_t coords = kNoIndex;     // `peer`: index into Program::coords
  std::uint32_t handles = kNoIndex;    // `handles`: index into Program::name_lists
  std::uint32_t sizes = kNoIndex;      // `size` attributes: index into Program::shapes, one slot per size attribute of the op (in op-table order), -1 = not given
  std::uint32_t bad_axis = kNoIndex;   // an `axis` the mesh lacks: index into Program::bad_axes (a finding, not a load error)
  std::uint32_t numbers = kNoIndex;    // the number attributes of an op with several (the optimizer ops): index into Program::number_lists
  NameId handle = -1, stream = -1, group = -1;  // group: a batched point-to-point group (batch_isend_irecv)
  NameId matches = -1, label = -1;              // Recv: the name its Send must send; Step: its label (e.g. 1F3)
  NameId sync = -1;                              // WaitStream: the stream waited for (`for`); RecordEvent / WaitEvent: the event
  std::uint32_t at = kNoIndex;                    // `at:` (an imported op's origin): index into Program::origins
  double number = 0;                   // scalar / scale / p / eps
  Placement to{}, from{};
  ReduceOp rop = ReduceOp::Sum;
  DType dtype = DType::F32;
  Reduction reduction = Reduction::Mean;
  AttnLayout layout = AttnLayout::BHSD;
  bool has_number : 1 = false;
  bool has_to : 1 = false;
  bool has_from : 1 = false;
  bool has_dtype : 1 = false;
  bool keepdim : 1 = false;
  bool causal : 1 = false;
  bool vocab_parallel : 1 = false;
  bool dropless : 1 = false;          // MoEDispatch
  bool rng_per_rank : 1 = false;
  bool dst_invariant : 1 = false;     // AllReduce/AllGather `dst: I`
  bool inverse : 1 = false;           // RoPE `inverse: true` (rotate by -angle: its VJP)
  bool uneven : 1 = false;            // a shard-creating op's `uneven: true`: torch.chunk layout, need not divide
  bool scalar_expr : 1 = false;       // `scalar` is a per-rank size expression (local view, axis_index): Program::scalar_expr
  bool reverse : 1 = false;           // CumSum `reverse: true`
  std::uint8_t choice = kNoChoice;    // any other enum attribute (`of`, `wrt`): index into its choices
  std::uint8_t order = 0;             // `order` of the context-parallel attention: 0 contiguous, 1 zigzag
};

struct Op {
  OpKind kind;
  std::uint8_t n_in = 0, n_out = 0;
  std::uint32_t first = 0;  // operands: ins then outs, in Program::operands
  Loc loc;
  OpAttrs attrs;
};

// The ops one group of ranks runs: `ops:` is one program for every rank; `programs:` gives several,
// each selected by mesh coordinates (an axis not named matches every coordinate).
struct RankProgram {
  Loc loc;
  std::vector<std::pair<int, std::int64_t>> selector;  // (axis, coordinate)
  std::uint32_t first_op = 0, n_ops = 0;               // a range of Program::ops
};

enum class P2PModel : std::uint8_t { Eager, Rendezvous };

// A stage of a `schedule:` that runs real ops (docs/schedules.md, "Stages"): a module instance, written once; the
// schedule runs its forward once per microbatch (F) and its derived backward (B, or I then W).
struct PipelineStage {
  Loc loc;
  std::vector<Op> ops;            // the instance's ops (operands in Program::operands)
  std::vector<NameId> ins, outs;  // its actual inputs and outputs
};

// An input cut into microbatches (`batch:` of a schedule): each rank cuts its local block along `dim`.
struct BatchSplit {
  NameId name = -1;
  int dim = 0;
  std::vector<std::int64_t> order;  // `order:` the part each microbatch reads (empty: its own)
  Loc loc;
};

// How a last-stage output is gathered over the microbatches after the schedule (`merge:`).
struct MergeSpec {
  enum Kind : std::uint8_t { Sum, Mean, Concat };
  NameId name = -1;
  Kind kind = Sum;
  int dim = 0;  // Concat
  Loc loc;
};

// `schedule:` in a program: a generated or imported pipeline schedule (expanded by schedules/).
struct ScheduleSpec {
  bool present = false;
  std::string kind;           // GPipe | 1F1B | Interleaved1F1B | ZBH1 (empty with csv)
  std::string csv;            // a PyTorch pipelining CSV file, relative to the program file
  int axis = -1;              // the pipeline mesh axis
  std::int64_t ranks = 0;     // its size
  std::int64_t microbatches = 0, virtual_stages = 1;
  Loc loc, kind_loc, csv_loc;
  // Stages that run real ops (empty: the steps are opaque and only the temporal checks run).
  std::vector<PipelineStage> stages;
  std::vector<BatchSplit> batch;
  std::vector<MergeSpec> merge;
  std::int64_t steps = 1;     // gradient accumulation: the schedule runs `steps` times on consecutive parts of the batch
  bool scale_grads = false;   // PyTorch's scale_grads: after each step a stage divides its gradients by `microbatches`
  Loc stages_loc, steps_loc, scale_grads_loc;
};

// A module instance (docs/format.md, "Modules"): ops [first_op, end_op) came from a module's body, expanded at
// `loc`; `label` says which instance ("layer 37 of 80 ..."), `file` the included file of the body (empty: this one).
struct Instance {
  std::uint32_t first_op = 0, end_op = 0;
  Loc loc;
  std::string label, file;
};

struct Program {
  std::string file;
  // The text the program was loaded from (shared by copies; null for a program built in code), and whether its
  // concrete sizes were loaded as variables (LoadOptions::generalize_sizes).
  std::shared_ptr<const std::string> source;
  bool generalized = false;
  std::string title;  // `name:` of the program
  std::vector<MeshAxis> mesh;
  std::vector<SizeVar> vars;               // symbolic sizes
  std::unordered_map<std::string, ExprId> sizes;  // every named size (concrete ones are constants)
  std::unordered_map<std::string, Loc> size_locs;
  ExprPool exprs;
  std::vector<std::string> names;          // NameId -> text
  NameTable name_ids;                      // text -> NameId
  std::vector<TensorDecl> tensors;
  std::vector<Op> ops;
  ScheduleSpec schedule;
  std::vector<RankProgram> programs;       // `programs:` (per_rank); an `ops:` program has none (ir/ranks.h rank_programs)
  bool per_rank = false;                   // written with `programs:`
  bool has_p2p_model = false;
  P2PModel p2p_model = P2PModel::Rendezvous;
  Loc p2p_model_loc;
  std::vector<NameId> operands;
  std::vector<OutputDecl> outputs;
  std::vector<std::vector<int>> int_lists;
  std::vector<std::vector<ExprId>> shapes;
  std::vector<Placements> placement_maps;
  std::vector<std::vector<std::pair<int, std::int64_t>>> coords;
  std::vector<std::vector<NameId>> name_lists;
  std::vector<std::vector<double>> number_lists;  // per op with several number attributes: one slot each (op-table order), NaN = not given
  struct BadAxis {
    std::string name;
    Loc loc;
  };
  std::vector<BadAxis> bad_axes;
  // Training (docs/format.md, "Training"): the loss the backward starts from, whether to derive the
  // backward, a hand-written backward, and the gradient synchronization run before the optimizer.
  // Their ops share `operands` and the side tables with `ops`; the checks of `ops` never see them.
  NameId loss = -1;
  Loc loss_loc;
  bool train = false;
  Loc train_loc;
  bool has_backward = false;
  Loc backward_loc;
  std::vector<Op> backward;
  bool has_grad_sync = false;
  Loc grad_sync_loc;
  std::vector<Op> grad_sync;
  // `optimizer:` (docs/format.md, "Optimizer"): the update run after grad_sync (AdamWUpdate, SGDUpdate, GradNormSq,
  // ClipCoef and ordinary ops on the gradients, parameters and optimizer states); `spec.optimizer` is the spec's.
  bool has_optimizer = false;
  Loc optimizer_loc;
  std::vector<Op> optimizer;
  std::vector<Instance> instances;         // innermost first for nested ones
  // Equivalence (docs/format.md, "Equivalence"; docs/equivalence.md): `view: local` makes `ops:` a local-view
  // plan (shard_map / Megatron style: each rank computes on its local pieces, sizes may use axis_index(NAME));
  // `spec:` is the single-device model the plan must equal. Spec ops share `operands` and the side tables with
  // `ops`, read the global tensors of `tensors:`, and are never seen by the spatial or temporal checks.
  bool local_view = false;
  Loc view_loc;
  struct SpecLink {
    NameId plan = -1, spec = -1;  // a plan tensor and the spec tensor it must equal once assembled
    Loc loc;
  };
  bool has_spec = false;
  Loc spec_loc;
  std::vector<Op> spec_ops;
  std::vector<SpecLink> spec_outputs;  // compared: each plan output with its spec tensor
  std::vector<SpecLink> lineage;       // intermediate correspondences (equal names are implicit)
  bool has_spec_optimizer = false;     // `spec.optimizer`: the single-device update the plan's `optimizer:` must equal
  Loc spec_optimizer_loc;
  std::vector<Op> spec_optimizer;

  // `at:` of imported ops (docs/import.md): "file:line[:col] [text] | file:line[:col] [text] | ...", the first
  // entry the op's place in the model's source, the others notes (the captured graph's line).
  std::vector<std::string> origins;

  bool has_expect = false;
  std::vector<std::string> expect;         // check IDs, as written
  Loc expect_loc;

  NameId intern(std::string_view n);
  // intern() of each of `keys` in order, into `ids` (the same ids; the table lookups overlap).
  void intern_all(std::span<const std::string_view> keys, NameId* ids);
  // Appends `op` (kind, location, attributes) with its operands; returns the stored op.
  Op& add_op(Op op, std::span<const NameId> ins, std::span<const NameId> outs) { return add_op(ops, op, ins, outs); }
  // The same, appending to another op list of this program (`backward`, `grad_sync`).
  Op& add_op(std::vector<Op>& list, Op op, std::span<const NameId> ins, std::span<const NameId> outs);
  std::span<const NameId> ins(const Op& op) const { return {operands.data() + op.first, op.n_in}; }
  std::span<const NameId> outs(const Op& op) const { return {operands.data() + op.first + op.n_in, op.n_out}; }
  const std::string& name(NameId id) const { return names[static_cast<std::size_t>(id)]; }
  int axis_count() const { return static_cast<int>(mesh.size()); }
  std::vector<std::string> axis_names() const;
  // Human text of a size expression / a shape.
  std::string expr_str(ExprId e) const { return exprs.str(e, vars); }
  std::string shape_str(std::span<const ExprId> shape) const;
  // The value of the size attribute `attr` of `op` (AttrType::Size), or -1 when it was not given.
  ExprId size_attr(const Op& op, std::string_view attr) const;
  // The slot of size attribute `attr` among the size attributes of `kind` (-1: the op has none by that name), and their count.
  static int size_slot(OpKind kind, std::string_view attr, int* count = nullptr);
  // The expression of a per-rank `scalar` (OpAttrs::scalar_expr, written with axis_index in the local view), or -1.
  ExprId scalar_expr(const Op& op) const { return op.attrs.scalar_expr ? shapes[op.attrs.sizes][0] : -1; }
  // Sets size attribute `attr` of `op` to `e` (creating the op's slots on first use).
  void set_size_attr(Op& op, std::string_view attr, ExprId e);
  // Ops with several number attributes (the optimizer ops) keep them in number_lists: the slot of `attr` among the
  // number attributes of `kind` (-1: none by that name) and their count; an op with at most one uses OpAttrs::number.
  static int number_slot(OpKind kind, std::string_view attr, int* count = nullptr);
  static bool several_numbers(OpKind kind) {
    int n = 0;
    number_slot(kind, "", &n);
    return n > 1;
  }
  // The value of number attribute `attr` of such an op, or `dflt` when it was not given.
  double number_attr(const Op& op, std::string_view attr, double dflt) const;
  void set_number_attr(Op& op, std::string_view attr, double v);
};

// Adds to each diagnostic at an op that came from a module instance a note naming the instance ("in layer 37 of
// 80 ...") at the line that expanded it; a diagnostic inside an included file moves to that line and keeps the
// included position in its message.
void annotate_instances(const Program& p, std::vector<Diagnostic>& diags);

// Moves each diagnostic (and note) at an op with `at:` to the first place `at:` names (the model's source line),
// keeping the other places and the op's line in this file as notes (docs/import.md, "Diagnostics").
void annotate_origins(const Program& p, const std::string& file, std::vector<Diagnostic>& diags);

}  // namespace spmd
