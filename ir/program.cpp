// ir/program.cpp - small Program helpers and dtypes.
#include "ir/program.h"
#include <stdexcept>

namespace spmd {

namespace {
constexpr std::pair<DType, std::string_view> kDTypes[] = {
    {DType::F32, "f32"},          {DType::F64, "f64"},          {DType::BF16, "bf16"}, {DType::F16, "f16"},
    {DType::FP8E4M3, "fp8_e4m3"}, {DType::FP8E5M2, "fp8_e5m2"}, {DType::I64, "i64"},   {DType::I32, "i32"},
    {DType::I8, "i8"},            {DType::Bool, "bool"},
};
}  // namespace

std::string_view dtype_name(DType d) {
  for (auto& [k, n] : kDTypes)
    if (k == d) return n;
  return "?";
}

bool parse_dtype(std::string_view s, DType& out) {
  static const std::pair<std::string_view, DType> aliases[] = {
      {"float32", DType::F32}, {"fp32", DType::F32},   {"float64", DType::F64}, {"bfloat16", DType::BF16},
      {"float16", DType::F16}, {"fp16", DType::F16},   {"int64", DType::I64},   {"int32", DType::I32},
      {"int8", DType::I8},     {"fp8", DType::FP8E4M3}};
  for (auto& [k, n] : kDTypes)
    if (n == s) return out = k, true;
  for (auto& [n, k] : aliases)
    if (n == s) return out = k, true;
  return false;
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> v;
  for (auto& [k, n] : kDTypes) v.emplace_back(n);
  return v;
}

NameId Program::intern(std::string_view n) {
  if (auto it = name_ids.find(n); it != name_ids.end()) return it->second;  // no node built for a known name
  auto id = static_cast<NameId>(names.size());
  name_ids.emplace(std::string(n), id);
  names.emplace_back(n);
  return id;
}

Op& Program::add_op(std::vector<Op>& list, Op op, std::span<const NameId> ins, std::span<const NameId> outs) {
  op.first = static_cast<std::uint32_t>(operands.size());
  op.n_in = static_cast<std::uint8_t>(ins.size());
  op.n_out = static_cast<std::uint8_t>(outs.size());
  operands.insert(operands.end(), ins.begin(), ins.end());
  operands.insert(operands.end(), outs.begin(), outs.end());
  list.push_back(op);
  return list.back();
}

std::vector<std::string> Program::axis_names() const {
  std::vector<std::string> v;
  for (const auto& a : mesh) v.push_back(a.name);
  return v;
}

std::string Program::shape_str(std::span<const ExprId> shape) const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + expr_str(shape[i]);
  return s + "]";
}

int Program::size_slot(OpKind kind, std::string_view attr, int* count) {
  int slot = -1, n = 0;
  for (const auto& a : op_info(kind).attrs) {
    if (a.type != AttrType::Size) continue;
    if (a.name == attr) slot = n;
    ++n;
  }
  if (count) *count = n;
  return slot;
}

ExprId Program::size_attr(const Op& op, std::string_view attr) const {
  int slot = size_slot(op.kind, attr);
  if (slot < 0 || op.attrs.sizes == kNoIndex) return -1;
  return shapes[op.attrs.sizes][static_cast<std::size_t>(slot)];
}

void Program::set_size_attr(Op& op, std::string_view attr, ExprId e) {
  int n = 0, slot = size_slot(op.kind, attr, &n);
  if (slot < 0) throw std::logic_error("set_size_attr: " + std::string(op_name(op.kind)) + " has no size attribute " + std::string(attr));
  if (op.attrs.sizes == kNoIndex) {
    op.attrs.sizes = static_cast<std::uint32_t>(shapes.size());
    shapes.emplace_back(static_cast<std::size_t>(n), -1);
  }
  shapes[op.attrs.sizes][static_cast<std::size_t>(slot)] = e;
}

void annotate_instances(const Program& p, std::vector<Diagnostic>& diags) {
  if (p.instances.empty()) return;
  for (auto& d : diags) {
    if (d.op < 0 || static_cast<std::size_t>(d.op) >= p.ops.size()) continue;
    auto op = static_cast<std::uint32_t>(d.op);
    bool moved = false;
    for (const Instance& in : p.instances) {  // innermost first
      if (op < in.first_op || op >= in.end_op) continue;
      if (!in.file.empty() && !moved) {
        d.message += " [at " + in.file + ":" + std::to_string(d.loc.line) + ":" + std::to_string(d.loc.col) + "]";
        for (auto& n : d.notes) n.loc = in.loc;
        d.loc = in.loc;
        moved = true;
      }
      d.notes.push_back({in.loc, "in " + in.label + ", expanded here"});
    }
  }
}

}  // namespace spmd
