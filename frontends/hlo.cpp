// frontends/hlo.cpp - the parser of HLO module text (as_text(), XLA dumps): the ENTRY computation's instructions
// `%name = f16[2048,64]{1,0} opcode(%a, %b), attr=value, metadata={source_file="..." source_line=N}`, parameters as
// inputs, the ROOT tuple as outputs. Other computations are reducers (by their ROOT opcode) or the bodies of `fusion`
// (`calls=`) and `call` (`to_apply=`), inlined where they are used: the optimized module of compile().as_text().
//
// Names: `.` and `-` become `_` (p9.10 is p9_10, custom-call.39 is custom_call_39) so that they are spmdcheck names;
// custom calls are targets `custom-call.<custom_call_target>` of the mapping files; a constant whose value the dump
// elides (`constant({...})`) is an input of the same name (the sequential and the ranks' modules then share it).
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <string_view>

#include "frontends/graph.h"

namespace spmd::frontends {

namespace {

constexpr std::size_t kMaxLine = std::size_t{16} << 20;
// Instructions of the whole module after inlining fusions and calls (a chain of computations that each call the
// previous one twice doubles at every step): checked before each inlining copies anything.
constexpr std::size_t kMaxInlined = std::size_t{1} << 20;

std::string sane(std::string_view n) {
  std::string s(n);
  for (auto& c : s)
    if (c == '.' || c == '-') c = '_';
  return s;
}

class Line {
 public:
  Line(std::string_view s, std::string file, std::uint32_t line) : s_(s), file_(std::move(file)), line_(line) {}
  void skip() {
    for (;;) {
      while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
      if (s_.compare(i_, 2, "/*") == 0) {  // /*index=5*/
        auto e = s_.find("*/", i_);
        i_ = e == std::string_view::npos ? s_.size() : e + 2;
        continue;
      }
      return;
    }
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool peek(char c) {
    skip();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool done() {
    skip();
    return i_ >= s_.size();
  }
  std::string word() {  // a name, opcode or bare token: letters, digits, _ . - % +
    skip();
    std::size_t a = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' || s_[i_] == '.' || s_[i_] == '-' || s_[i_] == '%' || s_[i_] == '+'))
      ++i_;
    return std::string(s_.substr(a, i_ - a));
  }
  // a balanced {...}, [...] or (...), or a "string", as text
  std::string group() {
    skip();
    std::size_t a = i_;
    int depth = 0;
    bool str = false;
    for (; i_ < s_.size(); ++i_) {
      char c = s_[i_];
      if (str) {
        if (c == '\\') ++i_;
        else if (c == '"') str = false;
        continue;
      }
      if (c == '"') str = true;
      else if (c == '{' || c == '[' || c == '(') ++depth;
      else if (c == '}' || c == ']' || c == ')') {
        if (--depth == 0) {
          ++i_;
          break;
        }
      } else if (depth == 0 && (c == ',' || c == ' ')) {
        break;
      }
      if (depth == 0 && c != '{' && c != '[' && c != '(' && str == false && i_ > a && (c == ',')) break;
    }
    if (depth > 0 || str) fail("unbalanced brackets or an unterminated string");
    return std::string(s_.substr(a, i_ - a));
  }
  Loc loc() const { return {line_, static_cast<std::uint32_t>(i_ + 1)}; }
  [[noreturn]] void fail(const std::string& m) const { throw ImportError(file_, loc(), m); }
  std::string_view rest() const { return s_.substr(i_); }

  // f16[2048,64,4]{2,1,0} -> type; a tuple (T, T) -> its element types in `tuple`
  TensorType type(std::vector<TensorType>* tuple) {
    skip();
    if (eat('(')) {
      while (!peek(')')) {
        TensorType t = type(nullptr);
        if (tuple) tuple->push_back(t);
        if (!eat(',') && !peek(')')) fail("expected ',' or ')' in a tuple type");
      }
      eat(')');
      return {};
    }
    std::size_t a = i_;
    while (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
    std::string dt(s_.substr(a, i_ - a));
    TensorType t;
    t.dtype = hlo_dtype(dt);
    if (t.dtype.empty()) fail("unknown element type '" + dt + "'");
    if (!eat('[')) fail("expected '[' after the element type");
    while (!peek(']')) {
      skip();
      // within this line only (the text goes on past it: strtoll would read the next line's digits)
      std::int64_t v = 0;
      auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + s_.size(), v);
      if (end == s_.data() + i_) fail("expected a dimension size");
      if (ec != std::errc() || v > (std::int64_t{1} << 40)) fail("a dimension size beyond 2^40");
      i_ = static_cast<std::size_t>(end - s_.data());
      if (v < 0) fail("a negative dimension size");
      t.shape.push_back(v);
      if (t.shape.size() > 8) fail("more than 8 dims (the limit)");
      if (!eat(',') && !peek(']')) fail("expected ',' or ']' in a shape");
    }
    eat(']');
    if (peek('{')) group();  // the layout
    return t;
  }

 private:
  std::string_view s_;
  std::string file_;
  std::uint32_t line_;
  std::size_t i_ = 0;
};

// source_file / source_line of `metadata={...}`. A stack `path\n----\n['a.py:1', 'b.py:2']` (transformers-neuronx)
// gives its deepest frame outside site-packages.
Origin origin_of(const std::string& meta) {
  Origin o;
  auto field = [&](const std::string& k) -> std::string {
    auto p = meta.find(k + "=");
    if (p == std::string::npos) return {};
    p += k.size() + 1;
    if (p < meta.size() && meta[p] == '"') {
      std::string v;
      for (++p; p < meta.size() && meta[p] != '"'; ++p) {
        if (meta[p] == '\\' && p + 1 < meta.size()) {
          ++p;
          v += meta[p] == 'n' ? '\n' : meta[p];
          continue;
        }
        v += meta[p];
      }
      return v;
    }
    auto e = meta.find_first_of(" }", p);
    return meta.substr(p, e == std::string::npos ? std::string::npos : e - p);
  };
  std::string f = field("source_file"), l = field("source_line");
  auto stack = f.find("\n----\n[");
  if (stack != std::string::npos) {
    std::string list = f.substr(stack + 7);
    std::size_t a = 0;
    for (;;) {
      auto q = list.find('\'', a);
      if (q == std::string::npos) break;
      auto q2 = list.find('\'', q + 1);
      if (q2 == std::string::npos) break;
      std::string frame = list.substr(q + 1, q2 - q - 1);
      auto colon = frame.rfind(':');
      if (colon != std::string::npos && frame.find("site-packages") == std::string::npos) {
        o.file = frame.substr(0, colon);
        o.line = static_cast<std::uint32_t>(std::strtoul(frame.c_str() + colon + 1, nullptr, 10));
      }
      a = q2 + 1;
    }
    if (!o.file.empty()) return o;
    f = f.substr(0, stack);
  }
  o.file = f;
  o.line = static_cast<std::uint32_t>(std::strtoul(l.c_str(), nullptr, 10));
  if (o.line == 0) o.file.clear();
  return o;
}

// A device number of replica_groups / source_target_pairs (digits only): one past 2^31 is bad input, not a crash.
std::int64_t device_id(const std::string& num, const std::string& file, Loc at) {
  if (num.size() > 9) throw ImportError(file, at, "device number " + num.substr(0, 24) + (num.size() > 24 ? "..." : "") + " is out of range");
  return std::stoll(num);
}

PyVal str_val(std::string s) {
  PyVal v;
  v.k = PyVal::K::Str;
  v.s = std::move(s);
  return v;
}

}  // namespace

std::string hlo_dtype(const std::string& s) {
  static const std::pair<const char*, const char*> map[] = {{"f32", "f32"}, {"f64", "f64"}, {"f16", "f16"}, {"bf16", "bf16"}, {"s64", "i64"}, {"s32", "i32"},
                                                            {"s16", "i32"}, {"s8", "i8"},   {"u8", "i8"},   {"u32", "i64"},   {"u64", "i64"}, {"pred", "bool"}};
  for (const auto& [k, v] : map)
    if (s == k) return v;
  return {};
}

Graph parse_hlo(const std::string& text, const std::string& file) {
  Graph g;
  g.file = file;
  g.format = "hlo";
  std::map<std::string, std::string> reducers;  // computation -> its ROOT opcode
  // A computation other than ENTRY, read whole: its instructions (parameters apart, by index) and its root.
  struct Comp {
    std::vector<Node> nodes;
    std::map<std::int64_t, std::string> params;
    std::string root;
    bool tuple_root = false;
  };
  std::map<std::string, Comp> comps;
  std::size_t stored = 0;  // instructions kept, inlined copies included (kMaxInlined)
  std::string comp;
  bool entry = false, in_comp = false, seen_module = false, ended = false;
  std::uint32_t line_no = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    std::string_view line(text.data() + at, (nl == std::string::npos ? text.size() : nl) - at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (line.size() > kMaxLine) throw ImportError(file, {line_no, 1}, "line longer than 16 MiB");
    std::size_t ind = line.find_first_not_of(" \t\r");
    if (ind == std::string_view::npos) continue;
    std::string_view body = line.substr(ind);
    if (body.rfind("HloModule ", 0) == 0) {
      seen_module = true;
      for (const char* k : {"replica_count=", "num_partitions="})  // the number of devices, when the dump names it
        if (auto p = body.find(k); p != std::string_view::npos) g.devices = std::max<std::int64_t>(g.devices, std::strtoll(body.data() + p + std::strlen(k), nullptr, 10));
      continue;
    }
    if (body[0] == '}') {
      if (entry) ended = true;
      in_comp = entry = false;
      continue;
    }
    if (!in_comp) {
      // `%name (p: T, ...) -> T {` or `ENTRY %name (...) -> ... {`
      if (body.back() != '{') continue;
      entry = body.rfind("ENTRY ", 0) == 0;
      Line l(entry ? body.substr(6) : body, file, line_no);
      comp = l.word();
      if (!comp.empty() && comp[0] == '%') comp.erase(0, 1);
      in_comp = true;
      continue;
    }
    Line l(body, file, line_no);
    bool root = body.rfind("ROOT ", 0) == 0;
    if (root) l.word();
    std::string name = l.word();
    if (name.empty() || name[0] != '%') name = "%" + name;
    name.erase(0, 1);
    Loc nloc{line_no, static_cast<std::uint32_t>(ind + 1)};
    if (!l.eat('=')) l.fail("expected '=' after the instruction name");
    std::vector<TensorType> tuple;
    TensorType type = l.type(&tuple);
    std::string opcode = l.word();
    if (opcode.empty()) l.fail("expected an opcode");
    if (root) reducers[comp] = opcode;
    Comp* callee_body = entry ? nullptr : &comps[comp];  // a computation other than ENTRY: kept to be inlined
    std::vector<Node>& into = callee_body ? callee_body->nodes : g.nodes;
    Node n;
    n.name = sane(name);
    n.target = opcode;
    n.loc = nloc;
    if (tuple.empty()) n.type = type;
    else n.tuple = tuple;
    if (!l.eat('(')) l.fail("expected '(' after the opcode");
    // operands: %a, %b (possibly typed: f32[] %a), or a literal (constant, parameter index, iota)
    std::vector<std::string> literal;
    while (!l.peek(')')) {
      if (l.done()) l.fail("unterminated operand list (a truncated file?)");
      std::string w = l.peek('{') ? l.group() : l.word();
      if (w.empty()) l.fail("unexpected text in the operand list: '" + std::string(l.rest().substr(0, 30)) + "'");
      if (w[0] != '%' && l.peek('[')) {  // a typed operand: f32[2,3]{1,0} %a
        l.group();
        if (l.peek('{')) l.group();
        w = l.word();
      }
      if (!w.empty() && w[0] == '%') {
        PyVal v;
        v.k = PyVal::K::Name;
        v.s = sane(w.substr(1));
        v.loc = l.loc();
        n.args.push_back(v);
      } else {
        literal.push_back(w);
      }
      if (!l.eat(',') && !l.peek(')')) l.fail("expected ',' or ')' in the operand list");
    }
    l.eat(')');
    while (l.eat(',')) {
      std::string key = l.word();
      if (!l.eat('=')) l.fail("expected '=' after attribute '" + key + "'");
      std::string val = l.peek('{') || l.peek('"') ? l.group() : l.word();
      if (key == "metadata") {
        n.origin = origin_of(val);
        continue;
      }
      if (!val.empty() && val.front() == '"') val = val.substr(1, val.size() - 2);
      if (key == "to_apply" && !val.empty() && val[0] == '%') val.erase(0, 1);
      n.kwargs.emplace_back(key, str_val(val));
    }
    if (!l.done()) l.fail("unexpected text after the instruction: '" + std::string(l.rest().substr(0, 40)) + "'");
    if (opcode == "fusion" || opcode == "call") {  // the called computation's instructions, here
      const PyVal* callee = n.kwarg(opcode == "fusion" ? "calls" : "to_apply");
      std::string cname = callee ? callee->s : "";
      if (!cname.empty() && cname[0] == '%') cname.erase(0, 1);
      auto it = comps.find(cname);
      if (it == comps.end()) throw ImportError(file, nloc, opcode + " of " + (cname.empty() ? "no computation" : "%" + cname + ", which is not a computation defined before this instruction"));
      const Comp& c = it->second;
      if (c.tuple_root) throw ImportError(file, nloc, opcode + " of %" + cname + ", which returns a tuple (a multi-output fusion), is not supported yet");
      if (c.root.empty()) throw ImportError(file, nloc, opcode + " of %" + cname + ", which has no ROOT instruction");
      if (c.params.size() != n.args.size())
        throw ImportError(file, nloc, opcode + " of %" + cname + " passes " + std::to_string(n.args.size()) + " operands to a computation of " + std::to_string(c.params.size()) + " parameters");
      std::map<std::string, PyVal> to;  // the callee's names -> the caller's values
      for (const auto& [i, pn] : c.params) {
        if (i < 0 || static_cast<std::size_t>(i) >= n.args.size()) throw ImportError(file, nloc, opcode + " of %" + cname + ": its parameter numbers are not 0 .. N-1");
        to[pn] = n.args[static_cast<std::size_t>(i)];
      }
      if (stored + c.nodes.size() > kMaxInlined)
        throw ImportError(file, nloc, opcode + " of %" + cname + " would make the module more than " + std::to_string(kMaxInlined) +
                                          " instructions once its fusions and calls are inlined");
      stored += c.nodes.size();
      const std::string prefix = n.name + "__";
      for (const Node& m : c.nodes) {
        PyVal v;
        v.k = PyVal::K::Name;
        v.s = prefix + m.name;
        to[m.name] = v;
      }
      auto rename = [&](auto& self, PyVal& v) -> void {
        if (v.k == PyVal::K::Name) {
          if (auto r = to.find(v.s); r != to.end()) {
            Loc at = v.loc;
            v = r->second;
            v.loc = at;
          }
        }
        for (auto& x : v.items) self(self, x);
      };
      for (Node m : c.nodes) {
        m.name = prefix + m.name;
        for (auto& a : m.args) rename(rename, a);
        if (!m.origin.line && n.origin.line) m.origin = n.origin;
        into.push_back(std::move(m));
      }
      // the caller's name: the callee's root, by a copy (typed as the caller says)
      n.target = "copy";
      n.args = {to[c.root]};
      n.kwargs.clear();
      opcode = "copy";
    }
    if (callee_body && opcode == "parameter") {  // a parameter of a called computation: the caller's operand
      std::int64_t idx = literal.empty() ? -1 : std::strtoll(literal[0].c_str(), nullptr, 10);
      if (idx < 0 || !callee_body->params.emplace(idx, n.name).second) l.fail("parameter number '" + (literal.empty() ? std::string() : literal[0]) + "' is missing or repeated");
      continue;
    }
    if (callee_body && opcode == "constant" && !literal.empty() && literal[0] == "{...}")
      l.fail("an elided constant ({...}) inside a called computation is not supported yet: dump with the constants printed");
    if (opcode == "parameter") {
      n.target = "placeholder";
      if (!n.type) l.fail("a parameter of tuple type is not supported yet");
      g.inputs.push_back(std::move(n));
      continue;
    }
    if (opcode == "constant") {
      std::string lit = literal.empty() ? "" : literal[0];
      if (lit == "{...}") {  // the dump elides the value: an input shared by name
        n.target = "placeholder";
        g.inputs.push_back(std::move(n));
        continue;
      }
      PyVal v;
      char* end = nullptr;
      double d = std::strtod(lit.c_str(), &end);
      if (lit == "-inf" || lit == "inf" || lit == "nan") d = lit == "nan" ? NAN : lit == "inf" ? HUGE_VAL : -HUGE_VAL, end = lit.data() + lit.size();
      if (lit == "true" || lit == "false") d = lit == "true", end = lit.data() + lit.size();
      if (lit.empty() || end != lit.c_str() + lit.size())
        throw ImportError(file, nloc, "constant " + name + " holds an array literal, which is not supported yet (only scalars and elided {...} constants)");
      v.k = PyVal::K::Float;
      v.f = d;
      n.args.push_back(v);
    }
    if (opcode == "get-tuple-element") {
      n.target = "getitem";
      const PyVal* idx = n.kwarg("index");
      PyVal k;
      k.k = PyVal::K::Int;
      k.i = idx ? std::strtoll(idx->s.c_str(), nullptr, 10) : 0;
      n.args.push_back(k);
      n.kwargs.clear();
    }
    if (opcode == "custom-call") {
      const PyVal* t = n.kwarg("custom_call_target");
      n.target = "custom-call." + (t ? t->s : std::string("?"));
    }
    if (const PyVal* ta = n.kwarg("to_apply")) {  // a reduction's combiner, by its root
      auto r = reducers.find(ta->s);
      if (r == reducers.end()) throw ImportError(file, nloc, "to_apply=%" + ta->s + " is not a computation defined before this instruction");
      n.kwargs.emplace_back("reducer", str_val(r->second));
    }
    if (const PyVal* st = n.kwarg("source_target_pairs"); st && opcode == "collective-permute") {  // its devices: one group
      std::vector<std::int64_t> grp;
      std::string num;
      for (char c : st->s + ",") {
        if (std::isdigit(static_cast<unsigned char>(c))) num += c;
        else if (!num.empty()) grp.push_back(device_id(num, file, nloc)), num.clear();
      }
      std::sort(grp.begin(), grp.end());
      grp.erase(std::unique(grp.begin(), grp.end()), grp.end());
      if (!grp.empty()) g.replica_groups.push_back(grp);
    }
    if (opcode == "all-reduce" || opcode == "all-reduce-start" || opcode == "reduce-scatter" || opcode == "all-gather" || opcode == "all-to-all") {
      // replica_groups={{0,1},{2,3}}: the device groups
      if (const PyVal* rg = n.kwarg("replica_groups")) {
        std::vector<std::int64_t> grp;
        std::string num;
        int depth = 0;
        for (char c : rg->s) {
          if (c == '{') ++depth, grp.clear();
          else if (std::isdigit(static_cast<unsigned char>(c))) num += c;
          else {
            if (!num.empty()) grp.push_back(device_id(num, file, nloc)), num.clear();
            if (c == '}' && depth-- == 2) g.replica_groups.push_back(grp);
          }
        }
      }
    }
    if (callee_body && root) {
      callee_body->root = n.name;
      callee_body->tuple_root = opcode == "tuple";
    }
    if (!callee_body && root && opcode == "tuple") {
      g.outputs = n.args;
      g.return_loc = nloc;
      continue;
    }
    if (!callee_body && root) {
      PyVal v;
      v.k = PyVal::K::Name;
      v.s = n.name;
      g.outputs = {v};
      g.return_loc = nloc;
    }
    into.push_back(std::move(n));
    ++stored;
  }
  if (!seen_module) throw ImportError(file, {1, 1}, "no `HloModule` header: not HLO module text");
  if (!ended) throw ImportError(file, {line_no ? line_no : 1, 1}, "the ENTRY computation does not end (a truncated file?)");
  return g;
}

}  // namespace spmd::frontends
