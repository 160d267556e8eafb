// ir/loader_impl.h - the loader's internals, shared by its source files (not part of the ir/ interface).
//
// Loader turns nodes (ir/doc.h) into a Program in a fixed order: name, sizes, mesh, tensors, include and
// modules (the prelude), then ops or programs, outputs, training and expect. ir/loader.cpp streams: it runs the
// prelude as soon as the keys before `ops` are read and then loads each op as it is parsed.
#pragma once
#include <algorithm>
#include <charconv>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/doc.h"
#include "ir/program.h"

namespace spmd::load_detail {

[[noreturn]] inline void fail(N n, const std::string& msg) { throw LoadError(n.loc(), msg); }
[[noreturn]] inline void fail_at(Loc l, const std::string& msg) { throw LoadError(l, msg); }

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A message part built only when an error needs it: pre + (inner ? inner's text : mid) + post. Converts from a
// string (which must outlive the call it is passed to), so the success path of a million ops builds no strings.
struct What {
  std::string_view pre, mid, post;
  const What* inner = nullptr;
  What(const std::string& s) : mid(s) {}  // NOLINT(google-explicit-constructor)
  What(const char* s) : mid(s) {}         // NOLINT(google-explicit-constructor)
  What(std::string_view a, std::string_view m, std::string_view b) : pre(a), mid(m), post(b) {}
  What(std::string_view a, const What& in) : pre(a), inner(&in) {}
  std::string str() const { return std::string(pre) + (inner ? inner->str() : std::string(mid)) + std::string(post); }
};

// "; did you mean 'x'?" for a near miss: a known synonym (inputs -> in) or a small edit distance.
std::string suggestion(const std::string& word, const std::vector<std::string>& cands);

inline std::string kind_of(N n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing";
  return "'" + excerpt(n.sv()) + "'";
}

// Iterates a mapping, rejecting duplicate and unknown keys. `fn(key, value)`.
template <class Fn>
void for_each_key(N map, const std::vector<std::string>& allowed, const What& where, Fn fn) {
  std::string_view seen[32];  // a few keys: a linear scan; many (a big `tensors:`): a hash set
  std::size_t n_seen = 0;
  std::unordered_set<std::string_view> many;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const N k = *it;
    ++it;
    const N v = *it;
    if (!k.IsScalar()) fail(k, "a key in " + where.str() + " must be a plain name");
    std::string_view key = k.sv();
    bool dup = many.empty() ? std::find(seen, seen + n_seen, key) != seen + n_seen : !many.insert(key).second;
    if (dup) fail(k, "duplicate key '" + k.Scalar() + "' in " + where.str());
    if (many.empty()) {
      if (n_seen == 32) many.insert(seen, seen + n_seen), many.insert(key);
      else seen[n_seen++] = key;
    }
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      fail(k, "unknown key '" + k.Scalar() + "' in " + where.str() + suggestion(k.Scalar(), allowed) + " (allowed: " + join(allowed) + ")");
    fn(k, v);
  }
}

inline bool parse_int(std::string_view s, std::int64_t& v) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') ++b;
  auto r = std::from_chars(b, e, v);
  return r.ec == std::errc() && r.ptr == e;
}

inline bool parse_bool(std::string_view s, bool& v) {
  if (s == "true" || s == "True" || s == "yes") return v = true, true;
  if (s == "false" || s == "False" || s == "no") return v = false, true;
  return false;
}

// Range checks of the number and size attributes of issue 23's ops, shared by load_attr and the JSON path: what
// is wrong with value `v` of attribute `name` of `kind`, or null when it is in range.
inline const char* number_range_error(OpKind kind, std::string_view name, double v) {
  bool attention = kind == OpKind::FlashAttention || kind == OpKind::AttentionGrad || kind == OpKind::RingAttention || kind == OpKind::RingAttentionStep;
  if (attention && name == "scale" && !(v > 0)) return "must be positive (the softmax scale of the scores, default 1/sqrt(D))";
  // the optimizer ops (torch.optim's own checks)
  if ((name == "beta1" || name == "beta2" || name == "momentum" || name == "dampening") && (v < 0 || v >= 1)) return "must be in [0, 1)";
  if ((name == "eps" || name == "weight_decay" || name == "lr") && v < 0) return "must not be negative";
  if (name == "max_norm" && !(v > 0)) return "must be positive";
  return nullptr;
}
inline const char* size_range_error(OpKind kind, std::string_view name, std::int64_t v) {
  if (v >= 1) return nullptr;
  if (kind == OpKind::TopKGate && name == "k") return "must be at least 1 (the experts each token picks)";
  if (kind == OpKind::OneHot && name == "classes") return "must be at least 1 (the number of classes)";
  if (kind == OpKind::Bincount && name == "length") return "must be at least 1 (the number of bins)";
  return nullptr;
}

inline const std::vector<std::string> kTopKeys = {"name", "description", "mesh", "sizes", "tensors", "ops", "outputs",
                                                 "expect", "programs", "schedule", "train", "backward", "p2p_model",
                                                 "loss", "grad_sync", "optimizer", "modules", "include", "spec", "view"};

// Bounds on module expansion (docs/format.md, "Limits"): checked before an instance is expanded, so a small
// file cannot expand into more memory or time than a large one (nested `repeat` multiplies).
inline constexpr int kMaxModuleDepth = 64;              // instances inside instances
inline constexpr std::int64_t kMaxExpansion = 250'000;  // ops and instances that `use:` and `repeat:` produce

// A module: a named op list with formal inputs and outputs, parameters and per-instance tensors.
struct Module {
  std::string name;
  N node, in, out, params, tensors, ops;
  std::string file;        // empty: the program file; else the included file it came from
  Loc include_at;          // for an included module: the program's `include` entry that brought it in
  bool expanding = false;  // being expanded (a module that uses itself is an error)
  std::size_t uses = 0;
  std::int64_t size = 0;  // ops and nested instances one instance expands to (capped just above kMaxExpansion)
  int index = 0;          // in the order modules are written (check_module_graph)
};

// The names of one module instance: formals map to actuals, every other name gets the instance's prefix.
struct Scope {
  std::unordered_map<std::string, NameId> formals;
  std::string prefix;  // "layers.37"
  std::vector<std::pair<std::string, std::string>> params;  // $name -> text
  const Module* module = nullptr;
  std::uint32_t serial = 0;  // the instance's number (Loader::owner_)
};

class Loader {
 public:
  Loader(Program& p, std::string file);
  // LoadOptions::generalize_sizes: integer sizes that no mesh axis names become single-valued variables.
  void generalize_sizes() { generalize_ = true; }
  // Loads the whole program from its root mapping (parts the prelude or streaming did are skipped).
  void load(N root);
  // Name, sizes, mesh, tensors, include and modules: what the ops depend on.
  void prelude(N root);
  // Its first part (name, sizes, mesh): what `tensors` depends on, run early when tensors are streamed.
  void prelude_head(N root);
  // One item of an op list: an op, a module instance (`use:`) or a repeat.
  void load_item(N item);
  // One entry of `tensors` (its key and value).
  void load_tensor(N k, N v);
  // One item of `programs:`.
  void load_program_item(N item);
  // The direct JSON path (ir/loader_json.cpp): an op item at `at` (its `{`), or a `tensors` entry (its key),
  // read straight from the text and stored, `at` moved past it; false, with nothing stored, when the item is
  // not of the plain form or the general path would reject it (the caller then reads it through the events).
  bool load_op_json(RawJson& at);
  bool load_tensor_json(RawJson& at);

 private:
  // ---- sizes and expressions ----------------------------------------------------------------
  // `op_attr`: an op's size attribute, where a mesh axis name is that axis' size (`end: S/cp`) and a local-view
  // program may use axis_index(NAME).
  ExprId parse_expr(N n, const What& what, bool op_attr = false);
  void load_view(N n);
  ExprId constant(std::int64_t v);  // p_.exprs.constant through a small cache
  std::int64_t size_int(N n, const std::string& what);
  void load_sizes(N n);
  ExprId load_symbolic(const std::string& name, N v);
  void load_mesh(N n);
  // ---- placements ---------------------------------------------------------------------------
  int axis_index(N k, const std::string& what = "placement");
  void load_shard_order(N n, Placements& pl, const std::string& what);
  Placement one_placement(N v);
  // A placement map {axis: P} or a list in mesh order. `rank` < 0: S(d) range checked later.
  Placements load_placements(N n, int rank, const What& what);
  // `op_attr`: an op's `shape` attribute (mesh axis names are sizes; axis_index in a local-view program).
  std::vector<ExprId> load_shape(N n, const What& what, std::vector<Loc>* locs, bool op_attr = false);
  double scale_expr(N v, const std::string& what);
  // ---- tensors ------------------------------------------------------------------------------
  void load_tensors(N n);
  DType load_dtype(N d);
  bool load_bool(N b, const std::string& what);
  // ---- ops ----------------------------------------------------------------------------------
  std::vector<NameId> load_names(N n, const std::string& what, bool allow_scalar);
  // The same for an op's `in`/`out` (a name or a list): into `out`, the message built only on an error.
  void load_names_into(N n, const char* key, const std::string& where, std::vector<NameId>& out);
  // Message parts per op kind, built once: its name, "attribute `x` of Op".
  const std::string& info_name(OpKind k);
  const std::string& attr_what(OpKind k, const AttrSpec& spec, const std::string& where);
  void load_ops(N n);
  // schedule: {kind: 1F1B, axis: pp, microbatches: 8, virtual_stages: 2} or {csv: file.csv, axis: pp}
  void load_schedule(N n);
  // Its stages that run real ops: `stages`, `batch`, `merge`, `steps`, `scale_grads` (ir/loader_pipeline.cpp).
  void load_stages(N n);
  // After `loss:`, `outputs:` and `spec:`: what a pipelined schedule needs of them.
  void check_pipeline(N root);
  void load_programs(N n);
  // A coordinate map {axis: int}: axes must exist, coordinates must be in range.
  std::vector<std::pair<int, std::int64_t>> load_coords(N v, const std::string& what);
  void load_op(N item);
  std::int64_t attr_int(N v, const std::string& what, std::int64_t lo, std::int64_t hi);
  void load_split_sizes(Op& op, N v, const std::string& what);
  void load_attr(Op& op, const AttrSpec& spec, N v, const std::string& where);
  // A tensor or handle name as written: renamed inside a module instance.
  // `at`: where it is written, for a clash with another instance's name (see claim).
  NameId name_id(std::string_view written, N at = N());
  // ---- training: loss, train, backward, grad_sync ---------------------------------------------
  void load_training(N root);
  static N find_key(N map, const std::string& key);
  // ---- equivalence: `spec:` (ir/loader_spec.cpp) ----------------------------------------------
  void load_spec(N root);
  void load_spec_optimizer(N spec, N key, std::vector<char>& spec_def);
  // ---- outputs and expectations -------------------------------------------------------------
  void load_outputs(N n);
  void load_expect(N n);
  // ---- modules, instances, repeat, include (ir/loader_modules.cpp) -------------------------
  void load_includes(N n);
  void load_modules(N n, const std::string& file);
  // Every module's `use:` graph: a cycle is an error even in a module no op uses; sets Module::size.
  void check_module_graph();
  // A name an instance uses as its own (`<instance>.<name>`) that the program or another instance already
  // declared or wrote is a clash: an error at `at` naming both (docs/format.md, "Names").
  void claim(NameId id, N at, std::string_view written);
  [[noreturn]] void clash(NameId id, N at, std::string_view written);
  void claim_program_name(NameId id);  // a name the program declares or writes (once instances exist)
  void load_instance(N item);
  void instantiate(Module& m, N item, const std::string& prefix, const std::vector<NameId>& ins,
                   const std::vector<NameId>& outs, const std::vector<std::pair<std::string, std::string>>& params,
                   const std::string& label);

  Program& p_;
  std::string file_;
  std::vector<Op>* target_ = &p_.ops;  // where load_op appends
  bool prelude_done_ = false, head_done_ = false;
  bool generalize_ = false;
  std::unordered_set<std::string> mesh_words_;  // generalize_: the words the mesh's sizes use (kept concrete)
  std::pair<std::int64_t, ExprId> const_cache_[64] = {};  // constant(): value -> id, direct-mapped
  std::unordered_map<std::string, Module> modules_;
  std::vector<std::unique_ptr<Doc>> docs_;  // included files and parameter-substituted module bodies
  std::unordered_set<std::string> included_;  // canonical paths of the files read by `include` (each read once)
  Loc include_at_;                            // the program's `include` entry being read
  std::size_t include_bytes_ = 0;             // text read by `include`, bounded like one input file
  std::vector<Scope> scopes_;
  // Names of instances: NameId -> 0 (unclaimed), 1 (the program's own) or 2 + the instance's serial.
  std::vector<std::uint32_t> owner_;
  std::vector<Loc> instance_at_;  // serial -> the item that expanded it
  std::int64_t expanded_ = 0;     // ops and instances produced by modules so far
  bool wrapped_ = false;          // a load error already names the instance it came from
  std::unordered_set<std::string> prefixes_;
  std::unordered_map<std::uint32_t, std::string> labels_;  // info_name / attr_what
  std::vector<NameId> ins_, outs_;                         // load_op's scratch
};

}  // namespace spmd::load_detail
