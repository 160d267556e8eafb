// frontends/custom_ops.h - custom ops (apex, vLLM, Megatron, Transformer Engine, a project's own) from mapping
// files read at run time, so a user adds one without rebuilding. The format is in docs/import.md; the defaults
// are frontends/custom_ops.yaml.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "frontends/lower.h"

namespace spmd::frontends {

struct CustomTemplateOp {
  std::string op;
  std::vector<std::string> in, out;
  std::vector<std::pair<std::string, std::string>> attrs;  // values may hold $name and $fn(args)
};

struct CustomOp {
  std::string target;
  std::string params;                        // "input, weight, bias, normalized_shape, eps"
  std::vector<std::string> results;          // result names, in order (more than one: a tuple)
  std::vector<CustomTemplateOp> ops;
  std::map<std::string, std::string> shapes;  // result -> the parameter whose shape it has
  std::string identity;                      // the result is this parameter unchanged
  bool inplace_identity = false;             // `identity: true`: a mutating op that leaves its arguments unchanged
  std::string file;
  Loc loc;
};

class CustomOps {
 public:
  // Reads a mapping file (throws ImportError at the offending line); later files override earlier entries.
  void load_file(const std::string& path);
  void load_text(const std::string& text, const std::string& name);
  const CustomOp* find(const std::string& target) const;
  void emit(Ctx& c, const CustomOp& op) const;
  std::size_t size() const { return ops_.size(); }

 private:
  std::map<std::string, CustomOp> ops_;
};

// Whether `target` is a mutating custom op that leaves its arguments unchanged (auto_functionalized of a logger).
bool custom_op_is_identity(const Ctx& c, const std::string& target);

// The default mapping files: $SPMDCHECK_OPS (a colon-separated list), else the repository's
// frontends/custom_ops.yaml when it exists, else the copy built into the binary.
CustomOps default_custom_ops();

}  // namespace spmd::frontends
