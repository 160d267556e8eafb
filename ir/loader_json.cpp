// ir/loader_json.cpp - the direct path for JSON ops and tensors: characters straight into the Program.
//
// A generated program is a million items of one shape: {"op":"MatMul","in":["h0","wq0"],"out":"q2_0"}. These
// functions read such an item from the raw text, with no events, no Doc nodes and no strings: keys are matched
// against the op table, values are checked as load_op / load_tensor check them, and the item goes into the
// Program only when every part is accepted. Anything else (an escape, an expression, a nested map, a value the
// general path would reject, a module instance) returns false with nothing changed, and the caller reads the
// same item through the events and the general path, which gives the same Program or the located error.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ir/loader_impl.h"

namespace spmd::load_detail {

namespace {

// A piece of the text (a string_view would zero itself on construction).
struct RawText {
  const char* p;
  std::size_t len;
  std::string_view sv() const { return {p, len}; }
};

// A position as two plain integers: the arrays below stay uninitialized until read (no constructor per slot).
struct RawLoc {
  std::uint32_t line, col;
  Loc loc() const { return {line, col}; }
};

// One JSON value as the direct path sees it: a scalar (its text, as the events give it) or a flat list of scalars.
// Plain data with no initializers: value() sets what it reads.
struct RawVal {
  bool list;
  bool quoted;            // a scalar: a JSON string
  bool null;              // a scalar: the literal null
  std::uint8_t n;         // a list: its items
  std::string_view text;  // a scalar
  RawLoc loc;
  RawText items[kMaxRank];
  bool item_quoted[kMaxRank];
  RawLoc item_locs[kMaxRank];
};

class Scan {
 public:
  explicit Scan(const RawJson& r) : r_(r) {}
  const RawJson& pos() const { return r_; }
  Loc here() const { return r_.here(); }
  RawLoc raw_here() const { return {r_.line, static_cast<std::uint32_t>(r_.p - r_.line_start + 1)}; }
  bool at(char c) const { return r_.p < r_.end && *r_.p == c; }
  bool eat(char c) {
    ws();
    if (!at(c)) return false;
    ++r_.p;
    return true;
  }
  void ws() {
    while (r_.p < r_.end) {
      char c = *r_.p;
      if (c == '\n') ++r_.line, r_.line_start = ++r_.p;
      else if (c == ' ' || c == '\t' || c == '\r') ++r_.p;
      else break;
    }
  }
  // A string without escapes (an escape leaves the item to the events, which decode it).
  bool string(std::string_view& out) {
    if (!at('"')) return false;
    const char* b = ++r_.p;
    while (r_.p < r_.end) {
      auto c = static_cast<unsigned char>(*r_.p);
      if (c == '"') {
        out = {b, static_cast<std::size_t>(r_.p - b)};
        ++r_.p;
        return true;
      }
      if (c == '\\' || c < 0x20) return false;
      ++r_.p;
    }
    return false;
  }
  // A scalar: a string, a number (JSON's grammar, as ir/doc.cpp reads it), true, false or null.
  bool scalar(std::string_view& out, bool& quoted, bool& null) {
    quoted = null = false;
    if (at('"')) return quoted = true, string(out);
    const char* b = r_.p;
    const char* e = r_.end;
    const char*& p = r_.p;
    if (p < e && (*p == '-' || (*p >= '0' && *p <= '9'))) {
      if (*p == '-') ++p;
      if (p < e && *p == '0') ++p;
      else if (p < e && *p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') ++p;
      else return false;
      if (p < e && *p == '.') {
        ++p;
        if (p >= e || *p < '0' || *p > '9') return false;
        while (p < e && *p >= '0' && *p <= '9') ++p;
      }
      if (p < e && (*p == 'e' || *p == 'E')) {
        ++p;
        if (p < e && (*p == '+' || *p == '-')) ++p;
        if (p >= e || *p < '0' || *p > '9') return false;
        while (p < e && *p >= '0' && *p <= '9') ++p;
      }
    } else if (e - p >= 4 && std::memcmp(p, "true", 4) == 0) {
      p += 4;
    } else if (e - p >= 5 && std::memcmp(p, "false", 5) == 0) {
      p += 5;
    } else if (e - p >= 4 && std::memcmp(p, "null", 4) == 0) {
      p += 4;
      null = true;
    } else {
      return false;
    }
    if (p < e && !std::strchr(" \t\r\n,]}", *p)) return false;
    out = {b, static_cast<std::size_t>(p - b)};
    return true;
  }
  // A scalar or a flat list of at most kMaxRank scalars (no nulls in a list).
  bool value(RawVal& v) {
    ws();
    v.loc = raw_here();
    if (!at('[')) {
      v.list = false;
      return scalar(v.text, v.quoted, v.null);
    }
    ++r_.p;
    v.list = true;
    v.n = 0;
    ws();
    if (at(']')) return ++r_.p, true;
    for (;;) {
      ws();
      if (v.n == kMaxRank) return false;
      bool null = false;
      v.item_locs[v.n] = raw_here();
      std::string_view t;
      if (!scalar(t, v.item_quoted[v.n], null) || null) return false;
      v.items[v.n] = {t.data(), t.size()};
      ++v.n;
      ws();
      if (at(']')) return ++r_.p, true;
      if (!at(',')) return false;
      ++r_.p;
    }
  }

 private:
  RawJson r_;
};

// The checks of Loader::attr_int without the message.
bool int_in(std::string_view s, std::int64_t lo, std::int64_t hi, std::int64_t& x) { return parse_int(s, x) && x >= lo && x <= hi; }

// A size written as a plain literal (what parse_expr reads without its parser); anything else is not taken here.
bool plain_size(std::string_view s, std::int64_t& v) {
  if (s.empty() || s.size() > 12) return false;
  v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return true;
}

// A shape of plain literals, checked as load_shape checks it.
bool plain_shape(const RawVal& v, std::int64_t* dims) {
  if (!v.list) return false;
  std::int64_t elems = 1;
  for (int i = 0; i < v.n; ++i) {
    if (!plain_size(v.items[i].sv(), dims[i]) || dims[i] < 1) return false;
    if (__builtin_mul_overflow(elems, dims[i], &elems) || elems > kMaxValue) return false;
  }
  return true;
}

// One attribute of an op, accepted and converted, waiting for the op to be accepted whole.
// Plain data with no initializers: each attribute type sets the fields its commit reads.
struct Pending {
  const AttrSpec* spec;
  const RawVal* v;
  std::int64_t ints[kMaxRank];
  int n;
  double number;
  Placement pl;
  std::uint32_t axes;
};

}  // namespace

bool Loader::load_op_json(RawJson& at) {
  if (!scopes_.empty() || target_ != &p_.ops || p_.local_view || target_->size() >= kMaxOps) return false;
  Scan s(at);
  const Loc loc = s.here();
  if (!s.eat('{')) return false;
  constexpr int kMaxKeys = 12;
  std::string_view keys[kMaxKeys];
  RawVal vals[kMaxKeys];
  int n_keys = 0, op_key = -1, in_key = -1, out_key = -1;
  s.ws();
  if (s.at('}')) return false;  // an empty op: the general path says what it needs
  for (;;) {
    s.ws();
    if (n_keys == kMaxKeys) return false;
    std::string_view key;
    if (!s.string(key) || !s.eat(':')) return false;
    for (int i = 0; i < n_keys; ++i)
      if (keys[i] == key) return false;  // a duplicate key
    keys[n_keys] = key;
    if (!s.value(vals[n_keys])) return false;
    if (key == "op") op_key = n_keys;
    else if (key == "in") in_key = n_keys;
    else if (key == "out") out_key = n_keys;
    ++n_keys;
    if (s.eat('}')) break;
    if (!s.eat(',')) return false;
  }
  if (op_key < 0 || vals[op_key].list || vals[op_key].null) return false;
  auto kind = op_by_name(vals[op_key].text);
  if (!kind) return false;
  const OpInfo& info = op_info(*kind);
  if (info.category == OpCategory::later) return false;

  // Every attribute, checked as load_attr checks it; nothing is stored yet.
  Pending pend[kMaxKeys];
  int n_pend = 0;
  std::uint64_t given = 0;
  std::uint32_t axes_seen = 0;  // every axes attribute sets the same mask: a repeat across them is an error too
  bool dropless = false, has_number = false;
  for (int k = 0; k < n_keys; ++k) {
    if (k == op_key || k == in_key || k == out_key) continue;
    const AttrSpec* spec = info.find_attr(keys[k]);
    if (!spec) return false;
    const RawVal& v = vals[k];
    if (!v.list && v.null) return false;
    given |= std::uint64_t{1} << (spec - info.attrs.data());
    Pending& a = pend[n_pend++];
    a.spec = spec;
    a.v = &v;
    const std::string& n = spec->name;
    switch (spec->type) {
      case AttrType::Axes: {
        if (v.list && v.n == 0) return false;
        a.axes = 0;
        int count = v.list ? v.n : 1;
        for (int i = 0; i < count; ++i) {
          std::string_view name = v.list ? v.items[i].sv() : v.text;
          int idx = -1;
          for (std::size_t m = 0; m < p_.mesh.size(); ++m)
            if (p_.mesh[m].name == name) idx = static_cast<int>(m);
          if (idx < 0 || (axes_seen & (1u << idx))) return false;  // an unknown axis is a finding with a note: the general path
          a.axes |= 1u << idx;
          axes_seen |= 1u << idx;
        }
        break;
      }
      case AttrType::Int: {
        if (v.list) return false;
        std::int64_t lo = -kMaxRank, hi = kMaxRank - 1;
        if (n == "src" || n == "dst") lo = 0, hi = 1 << 20;
        else if (n == "step") lo = 0, hi = 1 << 20;
        else if (n == "margin") lo = 0, hi = 64;
        if (!int_in(v.text, lo, hi, a.ints[0])) return false;
        break;
      }
      case AttrType::Ints:
        if (!v.list) {
          if (!int_in(v.text, -kMaxRank, kMaxRank - 1, a.ints[0])) return false;
          a.n = 1;
        } else {
          if (v.n == 0) return false;
          for (int i = 0; i < v.n; ++i)
            if (!int_in(v.items[i].sv(), -kMaxRank, kMaxRank - 1, a.ints[i])) return false;
          a.n = v.n;
        }
        break;
      case AttrType::Number: {
        if (v.list || v.text.empty() || v.text.size() > 63 || Program::several_numbers(*kind)) return false;  // several: the general path
        char buf[64];
        std::memcpy(buf, v.text.data(), v.text.size());
        buf[v.text.size()] = 0;
        char* end = nullptr;
        double d = std::strtod(buf, &end);
        if (end != buf + v.text.size() || !std::isfinite(d)) return false;  // an expression of sizes: the general path
        if (n == "p" && (d < 0 || d >= 1)) return false;
        if (n == "scalar" && d == 0 && *kind == OpKind::Div) return false;
        if (n == "capacity_factor" && (d <= 0 || d > 1e6)) return false;
        if (number_range_error(*kind, n, d)) return false;
        a.number = d;
        has_number = true;
        break;
      }
      case AttrType::Bool: {
        bool b = false;
        if (v.list || !parse_bool(v.text, b)) return false;
        a.ints[0] = b;
        if (n == "dropless") dropless = b;
        break;
      }
      case AttrType::Placement: {
        if (v.list) return false;
        auto pl = parse_placement(v.text, nullptr);
        if (!pl) return false;
        a.pl = *pl;
        break;
      }
      case AttrType::Reduce: {
        auto r = v.list ? std::nullopt : parse_reduce(v.text);
        if (!r) return false;
        a.ints[0] = static_cast<std::int64_t>(*r);
        break;
      }
      case AttrType::DType: {
        DType d;
        if (v.list || !parse_dtype(v.text, d)) return false;
        if ((*kind == OpKind::FP8Quantize || *kind == OpKind::FP8Scale) && d != DType::FP8E4M3 && d != DType::FP8E5M2) return false;
        a.ints[0] = static_cast<std::int64_t>(d);
        break;
      }
      case AttrType::Shape:
        if (n == "split_sizes" || !plain_shape(v, a.ints) || (n == "buffer" && v.n != 2)) return false;  // split sizes: the general path
        a.n = v.n;
        break;
      case AttrType::Name:
        if (v.list || v.text.empty() || (spec->name == "at" && v.text.size() > 4096)) return false;
        break;
      case AttrType::Enum: {
        if (v.list) return false;
        auto it = std::find(spec->choices.begin(), spec->choices.end(), v.text);
        if (it == spec->choices.end()) return false;
        a.ints[0] = it - spec->choices.begin();
        break;
      }
      case AttrType::Size:
        if (v.list || !plain_size(v.text, a.ints[0]) || a.ints[0] > kMaxSize || size_range_error(*kind, n, a.ints[0])) return false;
        break;
      case AttrType::Placements:
      case AttrType::Names:
      case AttrType::Coords:
        return false;  // maps and name lists: the general path
    }
  }
  for (const auto& a : info.attrs)
    if (a.required && !(given >> (&a - info.attrs.data()) & 1)) return false;

  if (*kind == OpKind::MoEDispatch && dropless && has_number) return false;
  // Operands: a name or a list of names, each a non-empty string.
  std::string_view names[2 * kMaxRank];  // `in` then `out`
  std::string_view* ins = names;
  std::string_view* outs = names + kMaxRank;
  int n_in = 0, n_out = 0;
  auto operands = [&](int k, std::string_view* out, int& n) {
    if (k < 0) return true;  // absent: none (the arity check below decides)
    const RawVal& v = vals[k];
    if (!v.list) {
      if (!v.quoted || v.text.empty()) return false;
      out[n++] = v.text;
      return true;
    }
    for (int i = 0; i < v.n; ++i) {
      if (!v.item_quoted[i] || v.items[i].len == 0) return false;
      out[n++] = v.items[i].sv();
    }
    return true;
  };
  if (!operands(in_key, ins, n_in) || !operands(out_key, outs, n_out)) return false;
  if (n_in < info.min_in || n_in > info.max_in || n_out < info.min_out || n_out > info.max_out) return false;
  for (int i = 0; i < n_out; ++i)
    for (int j = 0; j < i; ++j)
      if (outs[i] == outs[j]) return false;

  // Accepted: store it, in the order load_op does (attributes in key order, then `in`, then `out`).
  Op op;
  op.kind = *kind;
  op.loc = loc;
  OpAttrs& o = op.attrs;
  for (int i = 0; i < n_pend; ++i) {
    const Pending& a = pend[i];
    const std::string& n = a.spec->name;
    switch (a.spec->type) {
      case AttrType::Axes: o.axes |= a.axes; break;
      case AttrType::Int:
        if (n == "src" || n == "dst") o.rank = static_cast<std::int32_t>(a.ints[0]);
        else if (n == "step" || n == "margin") o.k = static_cast<std::int32_t>(a.ints[0]);
        else if (n == "concat_dim") o.dim2 = static_cast<std::int16_t>(a.ints[0]);
        else o.dim = static_cast<std::int16_t>(a.ints[0]);
        break;
      case AttrType::Ints:
        o.dims = static_cast<std::uint32_t>(p_.int_lists.size());
        p_.int_lists.emplace_back(a.ints, a.ints + a.n);
        break;
      case AttrType::Number:
        o.number = a.number;
        o.has_number = true;
        break;
      case AttrType::Bool: {
        bool b = a.ints[0] != 0;
        if (n == "keepdim") o.keepdim = b;
        else if (n == "causal") o.causal = b;
        else if (n == "vocab_parallel") o.vocab_parallel = b;
        else if (n == "dropless") o.dropless = b;
        else if (n == "inverse") o.inverse = b;
        else if (n == "uneven") o.uneven = b;
        else if (n == "reverse") o.reverse = b;
        break;
      }
      case AttrType::Placement:
        if (n == "to") o.to = a.pl, o.has_to = true;
        else o.from = a.pl, o.has_from = true;
        break;
      case AttrType::Reduce: o.rop = static_cast<ReduceOp>(a.ints[0]); break;
      case AttrType::DType:
        o.dtype = static_cast<DType>(a.ints[0]);
        o.has_dtype = true;
        break;
      case AttrType::Shape: {
        o.shape = static_cast<std::uint32_t>(p_.shapes.size());
        std::vector<ExprId> shape(static_cast<std::size_t>(a.n));
        for (int d = 0; d < a.n; ++d) shape[static_cast<std::size_t>(d)] = constant(a.ints[d]);
        p_.shapes.push_back(std::move(shape));
        break;
      }
      case AttrType::Name: {
        std::string_view t = a.v->text;
        if (n == "at") {  // over 4096 characters: the general path gives the error
          o.at = static_cast<std::uint32_t>(p_.origins.size());
          p_.origins.emplace_back(t);
          break;
        }
        (n == "handle" ? o.handle : n == "group" ? o.group : n == "matches" ? o.matches : n == "label" ? o.label : n == "for" || n == "event" ? o.sync : o.stream) =
            p_.intern(t);
        break;
      }
      case AttrType::Enum: {
        const std::string& c = a.spec->choices[static_cast<std::size_t>(a.ints[0])];
        if (n == "dst") o.dst_invariant = c == "I";
        else if (n == "rng") o.rng_per_rank = c == "per_rank";
        else if (n == "reduction") o.reduction = c == "sum" ? Reduction::Sum : c == "none" ? Reduction::None : Reduction::Mean;
        else if (n == "layout") o.layout = c == "bshd" ? AttnLayout::BSHD : c == "sbhd" ? AttnLayout::SBHD : AttnLayout::BHSD;
        else if (n == "order") o.order = c == "zigzag" ? 1 : 0;
        else o.choice = static_cast<std::uint8_t>(a.ints[0]);
        break;
      }
      case AttrType::Size: p_.set_size_attr(op, n, constant(a.ints[0])); break;
      case AttrType::Placements:
      case AttrType::Names:
      case AttrType::Coords: break;  // not taken above
    }
  }
  NameId in_ids[2 * kMaxRank];
  NameId* out_ids = in_ids + n_in;
  for (int i = 0; i < n_out; ++i) ins[n_in + i] = outs[i];
  p_.intern_all({ins, static_cast<std::size_t>(n_in + n_out)}, in_ids);
  if (!instance_at_.empty())
    for (int i = 0; i < n_out; ++i) claim_program_name(out_ids[i]);
  p_.add_op(*target_, op, {in_ids, static_cast<std::size_t>(n_in)}, {out_ids, static_cast<std::size_t>(n_out)});
  at = s.pos();
  return true;
}

bool Loader::load_tensor_json(RawJson& at) {
  if (!scopes_.empty() || p_.local_view) return false;
  Scan s(at);
  const Loc loc = s.here();
  std::string_view name;
  if (!s.string(name) || name.empty() || !s.eat(':')) return false;
  s.ws();
  if (!s.eat('{')) return false;
  RawVal shape, dtype, param, uneven;
  bool has_shape = false, has_dtype = false, has_param = false, has_uneven = false, has_pl = false;
  Loc pl_loc;
  Placements pl{};
  std::uint32_t pl_axes = 0;
  std::int64_t dims[kMaxRank];
  s.ws();
  if (s.at('}')) return false;  // no shape: the general path says so
  for (;;) {
    s.ws();
    std::string_view key;
    if (!s.string(key) || !s.eat(':')) return false;
    if (key == "placement") {
      // A map {axis: placement}; a list in mesh order, null or `order:` go to the general path.
      if (has_pl) return false;
      has_pl = true;
      s.ws();
      pl_loc = s.here();
      if (!s.eat('{')) return false;
      s.ws();
      if (!s.at('}')) {
        for (;;) {
          s.ws();
          std::string_view axis, text;
          bool quoted = false, null = false;
          if (!s.string(axis) || !s.eat(':')) return false;
          s.ws();
          if (!s.scalar(text, quoted, null) || null) return false;
          int idx = -1;
          for (std::size_t m = 0; m < p_.mesh.size(); ++m)
            if (p_.mesh[m].name == axis) idx = static_cast<int>(m);
          if (idx < 0 || (pl_axes & (1u << idx))) return false;  // `order`, an unknown or a repeated axis
          pl_axes |= 1u << idx;
          auto one = parse_placement(text, nullptr);
          if (!one) return false;
          pl[static_cast<std::size_t>(idx)] = *one;
          if (s.eat('}')) break;
          if (!s.eat(',')) return false;
        }
      } else {
        s.eat('}');
      }
    } else {
      RawVal* v = key == "shape" ? &shape : key == "dtype" ? &dtype : key == "param" ? &param : key == "uneven" ? &uneven : nullptr;
      bool* seen = key == "shape" ? &has_shape : key == "dtype" ? &has_dtype : key == "param" ? &has_param : key == "uneven" ? &has_uneven : nullptr;
      if (!v || *seen) return false;
      *seen = true;
      if (!s.value(*v)) return false;
    }
    if (s.eat('}')) break;
    if (!s.eat(',')) return false;
  }
  if (!has_shape || !plain_shape(shape, dims)) return false;
  const int rank = shape.n;
  for (auto& one : pl) {
    if (!one.is_s()) continue;
    if (one.dim < -rank || one.dim >= rank) return false;
    if (one.dim < 0) one.dim = static_cast<std::int16_t>(one.dim + rank);
  }
  TensorDecl t;
  if (has_dtype && (dtype.list || dtype.null || !parse_dtype(dtype.text, t.dtype))) return false;
  if (has_param && (param.list || param.null || !parse_bool(param.text, t.param))) return false;
  if (has_uneven && (uneven.list || uneven.null || !parse_bool(uneven.text, t.uneven))) return false;
  // Accepted; a name declared before is the general path's (the streaming pass then restarts in order).
  const std::size_t known = p_.names.size();
  t.name = p_.intern(name);
  if (p_.names.size() == known) return false;
  t.loc = loc;
  t.shape_loc = shape.loc.loc();
  t.shape.resize(static_cast<std::size_t>(rank));
  t.dim_locs.resize(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d) t.dim_locs[static_cast<std::size_t>(d)] = shape.item_locs[d].loc();
  for (int d = 0; d < rank; ++d) t.shape[static_cast<std::size_t>(d)] = constant(dims[d]);
  t.placement_loc = has_pl ? pl_loc : loc;
  t.placement = pl;
  p_.tensors.push_back(std::move(t));
  at = s.pos();
  return true;
}

}  // namespace spmd::load_detail
