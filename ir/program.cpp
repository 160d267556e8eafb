// ir/program.cpp - small Program helpers and dtypes.
#include "ir/program.h"

#include <cmath>
#include <stdexcept>

#include <cstring>

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

std::uint32_t NameTable::hash_of(std::string_view key) {
  // FNV-1a over 8-byte words, then a 64-bit mix: names are short and alike (q2_17, q2_18).
  std::uint64_t h = 0xcbf29ce484222325ull ^ key.size();
  std::size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, key.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  std::uint64_t w = 0;
  std::memcpy(&w, key.data() + i, key.size() - i);
  h = (h ^ w) * 0xff51afd7ed558ccdull;
  h ^= h >> 32;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return static_cast<std::uint32_t>(h);
}

const NameTable::Entry* NameTable::find_entry(std::string_view key, std::uint32_t h) const {
  if (slots_.empty()) return nullptr;
  std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const Entry& e = slots_[i];
    if (e.len == kEmpty) return nullptr;
    if (e.hash == h && e.len == key.size() && std::memcmp(chars_.data() + e.off, key.data(), key.size()) == 0) return &e;
  }
}

NameTable::Iter NameTable::find(std::string_view key) const {
  const Entry* e = find_entry(key, hash_of(key));
  return e ? Iter({std::string(chars_.data() + e->off, e->len), e->id}) : Iter();
}

void NameTable::grow(std::size_t slots) {
  std::vector<Entry> old(slots, Entry{0, 0, kEmpty, -1});
  old.swap(slots_);
  std::size_t mask = slots_.size() - 1;
  for (const Entry& e : old) {
    if (e.len == kEmpty) continue;
    std::size_t i = e.hash & mask;
    while (slots_[i].len != kEmpty) i = (i + 1) & mask;
    slots_[i] = e;
  }
}

void NameTable::reserve(std::size_t n) {
  std::size_t want = 16;
  while (want / 8 * 7 < n) want *= 2;
  if (want > slots_.size()) grow(want);
}

NameId NameTable::find_or_insert(std::string_view key, NameId id) {
  if ((size_ + 1) * 8 > slots_.size() * 7) grow(slots_.empty() ? 16 : slots_.size() * 2);
  std::uint32_t h = hash_of(key);
  std::size_t mask = slots_.size() - 1;
  std::size_t i = h & mask;
  for (; slots_[i].len != kEmpty; i = (i + 1) & mask) {
    const Entry& e = slots_[i];
    if (e.hash == h && e.len == key.size() && std::memcmp(chars_.data() + e.off, key.data(), key.size()) == 0) return e.id;
  }
  slots_[i] = {h, static_cast<std::uint32_t>(chars_.size()), static_cast<std::uint32_t>(key.size()), id};
  chars_.append(key);
  ++size_;
  return id;
}

void NameTable::prefetch(std::span<const std::string_view> keys) {
  if ((size_ + keys.size()) * 8 > slots_.size() * 7) reserve(std::max<std::size_t>(size_ + keys.size(), slots_.size()));
  std::size_t mask = slots_.size() - 1;
  for (std::string_view k : keys) __builtin_prefetch(&slots_[hash_of(k) & mask]);
}

void NameTable::clear() {
  slots_.clear();
  chars_.clear();
  size_ = 0;
}

NameId Program::intern(std::string_view n) {
  auto next = static_cast<NameId>(names.size());
  NameId id = name_ids.find_or_insert(n, next);
  if (id == next) names.emplace_back(n);
  return id;
}

void Program::intern_all(std::span<const std::string_view> keys, NameId* ids) {
  name_ids.prefetch(keys);
  for (std::size_t i = 0; i < keys.size(); ++i) ids[i] = intern(keys[i]);
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

namespace {

// The slot of attribute `attr` among the attributes of `kind` of type `type` (op-table order; -1: none by that
// name), and in `count` how many it has.
int attr_slot(OpKind kind, AttrType type, std::string_view attr, int* count) {
  int slot = -1, n = 0;
  for (const auto& a : op_info(kind).attrs) {
    if (a.type != type) continue;
    if (a.name == attr) slot = n;
    ++n;
  }
  if (count) *count = n;
  return slot;
}

}  // namespace

int Program::size_slot(OpKind kind, std::string_view attr, int* count) { return attr_slot(kind, AttrType::Size, attr, count); }

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

int Program::number_slot(OpKind kind, std::string_view attr, int* count) { return attr_slot(kind, AttrType::Number, attr, count); }

double Program::number_attr(const Op& op, std::string_view attr, double dflt) const {
  int slot = number_slot(op.kind, attr);
  if (slot < 0 || op.attrs.numbers == kNoIndex) return dflt;
  double v = number_lists[op.attrs.numbers][static_cast<std::size_t>(slot)];
  return std::isnan(v) ? dflt : v;
}

void Program::set_number_attr(Op& op, std::string_view attr, double v) {
  int n = 0, slot = number_slot(op.kind, attr, &n);
  if (slot < 0) throw std::logic_error("set_number_attr: " + std::string(op_name(op.kind)) + " has no number attribute " + std::string(attr));
  if (op.attrs.numbers == kNoIndex) {
    op.attrs.numbers = static_cast<std::uint32_t>(number_lists.size());
    number_lists.emplace_back(static_cast<std::size_t>(n), std::nan(""));
  }
  number_lists[op.attrs.numbers][static_cast<std::size_t>(slot)] = v;
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

namespace {

struct OriginEntry {
  std::string file, text;
  Loc loc;
};

// "path:line[:col] [text] | path:line[:col] [text] | ..." (entries without a line number are skipped).
std::vector<OriginEntry> parse_origin(const std::string& s) {
  std::vector<OriginEntry> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    std::size_t bar = s.find(" | ", a);
    std::string e = s.substr(a, bar == std::string::npos ? std::string::npos : bar - a);
    std::size_t sp = e.find(' ');
    std::string where = e.substr(0, sp), text = sp == std::string::npos ? "" : e.substr(sp + 1);
    auto num = [](const std::string& t) { return !t.empty() && t.size() < 10 && t.find_first_not_of("0123456789") == std::string::npos; };
    std::size_t c1 = where.rfind(':');
    if (c1 != std::string::npos && num(where.substr(c1 + 1))) {
      OriginEntry o;
      o.text = text;
      std::size_t c2 = where.rfind(':', c1 - 1);
      if (c2 != std::string::npos && c2 < c1 && num(where.substr(c2 + 1, c1 - c2 - 1))) {
        o.file = where.substr(0, c2);
        o.loc = {static_cast<std::uint32_t>(std::stoul(where.substr(c2 + 1, c1 - c2 - 1))), static_cast<std::uint32_t>(std::stoul(where.substr(c1 + 1)))};
      } else {
        o.file = where.substr(0, c1);
        o.loc = {static_cast<std::uint32_t>(std::stoul(where.substr(c1 + 1))), 0};
      }
      if (!o.file.empty() && o.loc.line) out.push_back(std::move(o));
    }
    if (bar == std::string::npos) break;
    a = bar + 3;
  }
  return out;
}

}  // namespace

void annotate_origins(const Program& p, const std::string& file, std::vector<Diagnostic>& diags) {
  if (p.origins.empty()) return;
  std::unordered_map<std::uint32_t, std::uint32_t> at_line;  // a line of this file -> the `at:` of the op written there
  for (const auto* list : {&p.ops, &p.spec_ops, &p.backward, &p.grad_sync})
    for (const Op& op : *list)
      if (op.attrs.at != kNoIndex) at_line.emplace(op.loc.line, op.attrs.at);
  for (auto& d : diags) {
    for (auto& n : d.notes) {
      if (!n.file.empty()) continue;
      auto it = at_line.find(n.loc.line);
      if (it == at_line.end()) continue;
      auto es = parse_origin(p.origins[it->second]);
      if (es.empty()) continue;
      std::string also;
      for (std::size_t k = 1; k < es.size(); ++k) also += (also.empty() ? "" : "; ") + es[k].file + ":" + std::to_string(es[k].loc.line) + (es[k].text.empty() ? "" : " " + es[k].text);
      n.message += " [" + file + ":" + std::to_string(n.loc.line) + (also.empty() ? "" : "; " + also) + "]";
      n.file = es[0].file;
      n.loc = es[0].loc;
    }
    if (!d.file.empty()) continue;
    auto it = at_line.find(d.loc.line);
    if (it == at_line.end()) continue;
    auto es = parse_origin(p.origins[it->second]);
    if (es.empty()) continue;
    std::vector<Note> front;
    for (std::size_t k = 1; k < es.size(); ++k) front.push_back({es[k].loc, "in the captured graph" + (es[k].text.empty() ? "" : ": " + es[k].text), es[k].file});
    front.push_back({d.loc, "imported as this op"});
    for (auto& n : d.notes)  // notes the check placed at the op itself now read at its source line
      if (n.file.empty() && n.loc.line == d.loc.line) n.file = es[0].file, n.loc = es[0].loc;
    d.notes.insert(d.notes.begin(), front.begin(), front.end());
    d.file = es[0].file;
    d.loc = es[0].loc;
  }
}

}  // namespace spmd
