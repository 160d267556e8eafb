// frontends/fx.cpp - the parser of GraphModule.print_readable() text (the form TORCH_LOGS=aot_graphs, tlparse and
// torch.compile's debug dumps print): typed placeholders, one `name: "f32[8, 16]" = torch.ops.ns.op.overload(...)`
// per line, `# File: path:line in fn, code: ...` comments, tuple results read by `x[0]`, and `return [...]`.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "frontends/graph.h"

namespace spmd::frontends {

namespace {

constexpr std::size_t kMaxLine = 1 << 20;  // one node's line; longer is a malformed dump
constexpr int kMaxDepth = 64;              // nesting of lists and calls in one expression

// A recursive-descent reader of the Python expressions FX prints: names, dotted names, numbers, strings, lists,
// tuples, calls with keyword arguments and subscripts.
class ExprReader {
 public:
  ExprReader(std::string_view s, std::string file, std::uint32_t line, std::uint32_t col0) : s_(s), file_(std::move(file)), line_(line), col0_(col0) {}

  PyVal expr(int depth = 0) {
    if (depth > kMaxDepth) fail("expression nested too deeply");
    PyVal v = atom(depth);
    for (;;) {
      skip();
      if (peek('(')) {
        ++i_;
        PyVal c;
        c.k = PyVal::K::Call;
        c.loc = v.loc;
        if (v.k != PyVal::K::Name) fail("a call of something that is not a name");
        c.s = v.s;
        args(c, depth);
        v = std::move(c);
      } else if (peek('[')) {
        ++i_;
        PyVal x;
        x.k = PyVal::K::Index;
        x.loc = v.loc;
        x.items.push_back(std::move(v));
        x.items.push_back(expr(depth + 1));
        expect(']');
        v = std::move(x);
      } else if (peek('.')) {
        ++i_;
        std::string n = ident();
        if (n.empty()) fail("expected a name after '.'");
        if (v.k != PyVal::K::Name) fail("an attribute of something that is not a name");
        v.s += "." + n;
      } else {
        return v;
      }
    }
  }

  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool peek(char c) {
    skip();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool at_end() {
    skip();
    return i_ >= s_.size();
  }
  void expect(char c) {
    if (!peek(c)) fail(std::string("expected '") + c + "'" + (i_ < s_.size() ? std::string(", got '") + s_[i_] + "'" : std::string(" before the end of the line")));
    ++i_;
  }
  std::string ident() {
    skip();
    std::size_t a = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_')) ++i_;
    if (a < s_.size() && a < i_ && std::isdigit(static_cast<unsigned char>(s_[a]))) {
      i_ = a;
      return {};
    }
    return std::string(s_.substr(a, i_ - a));
  }
  Loc loc() const { return {line_, col0_ + static_cast<std::uint32_t>(i_)}; }
  std::size_t pos() const { return i_; }
  void set_pos(std::size_t p) { i_ = p; }
  std::string_view rest() const { return s_.substr(i_); }
  [[noreturn]] void fail(const std::string& m) const { throw ImportError(file_, loc(), m); }

  std::string string_lit() {
    skip();
    char q = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

 private:
  PyVal atom(int depth) {
    skip();
    PyVal v;
    v.loc = loc();
    if (i_ >= s_.size()) fail("expected a value before the end of the line");
    char c = s_[i_];
    if (c == '[' || c == '(') {
      ++i_;
      v.k = c == '[' ? PyVal::K::List : PyVal::K::Tuple;
      char close = c == '[' ? ']' : ')';
      while (!peek(close)) {
        v.items.push_back(expr(depth + 1));
        if (peek(',')) ++i_;
        else if (!peek(close)) fail(std::string("expected ',' or '") + close + "'");
      }
      ++i_;
      if (v.k == PyVal::K::Tuple && v.items.size() == 1) {  // (x) is x; (x,) is a tuple
        // Distinguishing them needs the comma; FX prints tuples with a trailing comma, parentheses never wrap a value alone.
      }
      return v;
    }
    if (c == '\'' || c == '"') {
      v.k = PyVal::K::Str;
      v.s = string_lit();
      return v;
    }
    if (c == '-' || c == '+' || std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      bool neg = c == '-';
      if (c == '-' || c == '+') {
        ++i_;
        skip();
        if (i_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[i_]))) {  // -inf
          std::string n = ident();
          if (n != "inf" && n != "nan") fail("expected a number after '-'");
          v.k = PyVal::K::Float;
          v.f = n == "inf" ? (neg ? -HUGE_VAL : HUGE_VAL) : NAN;
          return v;
        }
      }
      std::size_t a = i_;
      bool flt = false;
      while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' ||
                                ((s_[i_] == '-' || s_[i_] == '+') && (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E')))) {
        if (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E') flt = true;
        ++i_;
      }
      std::string t(s_.substr(a, i_ - a));
      char* end = nullptr;
      if (flt) {
        v.k = PyVal::K::Float;
        v.f = std::strtod(t.c_str(), &end);
        if (neg) v.f = -v.f;
      } else {
        v.k = PyVal::K::Int;
        errno = 0;
        v.i = std::strtoll(t.c_str(), &end, 10);
        if (errno) fail("integer out of range: " + t);
        if (neg) v.i = -v.i;
      }
      if (end != t.c_str() + t.size() || t.empty()) fail("bad number '" + t + "'");
      return v;
    }
    std::string n = ident();
    if (n.empty()) fail(std::string("unexpected '") + c + "'");
    if (n == "None") return v.k = PyVal::K::None, v;
    if (n == "True" || n == "False") return v.k = PyVal::K::Bool, v.b = n == "True", v;
    if (n == "inf" || n == "nan") return v.k = PyVal::K::Float, v.f = n == "inf" ? HUGE_VAL : NAN, v;
    v.k = PyVal::K::Name;
    v.s = n;
    return v;
  }

  void args(PyVal& c, int depth) {
    while (!peek(')')) {
      std::size_t save = i_;
      std::string n = ident();
      skip();
      if (!n.empty() && i_ < s_.size() && s_[i_] == '=' && (i_ + 1 >= s_.size() || s_[i_ + 1] != '=')) {
        ++i_;
        c.kw.emplace_back(n, expr(depth + 1));
      } else {
        i_ = save;
        if (!c.kw.empty()) fail("a positional argument after a keyword argument");
        c.items.push_back(expr(depth + 1));
      }
      if (peek(',')) ++i_;
      else if (!peek(')')) fail("expected ',' or ')' in the argument list");
    }
    ++i_;
  }

  std::string_view s_;
  std::string file_;
  std::uint32_t line_, col0_;
  std::size_t i_ = 0;
};

// "f32[8, 1536, 768]" -> {f32, [8, 1536, 768]}; a symbolic dim or an unknown dtype is an error at `at`.
TensorType parse_type(const std::string& t, const std::string& file, Loc at) {
  if (t.rfind("Sym(", 0) == 0 && t.back() == ')') {  // a symbolic int (a dynamic size): an error where it is used
    TensorType s;
    s.dtype = "i64";
    s.symbolic = t.substr(4, t.size() - 5);
    return s;
  }
  auto lb = t.find('['), rb = t.rfind(']');
  if (lb == std::string::npos || rb == std::string::npos || rb < lb || rb + 1 != t.size())
    throw ImportError(file, at, "type annotation '" + t + "' is not of the form dtype[d0, d1, ...]");
  TensorType out;
  std::string dt = t.substr(0, lb);
  out.dtype = fx_dtype(dt);
  if (out.dtype.empty()) throw ImportError(file, at, "unknown dtype '" + dt + "' in type annotation '" + t + "'");
  std::string body = t.substr(lb + 1, rb - lb - 1);
  std::size_t a = 0;
  while (a < body.size()) {
    auto comma = body.find(',', a);
    std::string d = body.substr(a, comma == std::string::npos ? std::string::npos : comma - a);
    while (!d.empty() && d.front() == ' ') d.erase(d.begin());
    while (!d.empty() && d.back() == ' ') d.pop_back();
    char* end = nullptr;
    long long v = std::strtoll(d.c_str(), &end, 10);
    if (d.empty() || end != d.c_str() + d.size() || v < 0) {  // a symbolic dim: an error only where the node is used
      if (out.symbolic.empty()) out.symbolic = d;
      v = -1;
    }
    out.shape.push_back(v);
    if (out.shape.size() > 8) throw ImportError(file, at, "type annotation '" + t + "' has more than 8 dims (the limit)");
    if (comma == std::string::npos) break;
    a = comma + 1;
  }
  return out;
}

// `# File: /path/x.py:252 in forward, code: y = f(x)`
Origin parse_origin(std::string_view c) {
  Origin o;
  auto in = c.find(" in ");
  std::string_view loc = in == std::string_view::npos ? c : c.substr(0, in);
  auto colon = loc.rfind(':');
  if (colon == std::string_view::npos) return o;
  o.file = std::string(loc.substr(0, colon));
  o.line = static_cast<std::uint32_t>(std::strtoul(std::string(loc.substr(colon + 1)).c_str(), nullptr, 10));
  auto code = c.find(", code: ");
  if (code != std::string_view::npos) o.code = std::string(c.substr(code + 8));
  return o;
}

}  // namespace

std::string fx_dtype(const std::string& s) {
  static const std::pair<const char*, const char*> map[] = {{"f32", "f32"}, {"f64", "f64"}, {"f16", "f16"}, {"bf16", "bf16"}, {"i64", "i64"},
                                                            {"i32", "i32"}, {"i16", "i32"}, {"i8", "i8"},   {"u8", "i8"},     {"b8", "bool"},
                                                            {"f8e4m3fn", "fp8_e4m3"}, {"f8e5m2", "fp8_e5m2"}};
  for (const auto& [k, v] : map)
    if (s == k) return v;
  return {};
}

Graph parse_fx(const std::string& text, const std::string& file) {
  Graph g;
  g.file = file;
  g.format = "fx";
  Origin origin;
  bool in_forward = false, returned = false;
  std::uint32_t line_no = 0;
  std::size_t at = 0;
  Loc forward_loc;
  while (at < text.size()) {
    std::size_t nl = text.find('\n', at);
    std::string_view line(text.data() + at, (nl == std::string::npos ? text.size() : nl) - at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (line.size() > kMaxLine) throw ImportError(file, {line_no, 1}, "line longer than 1 MiB");
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::size_t ind = line.find_first_not_of(" \t");
    if (ind == std::string_view::npos) continue;
    std::string_view body = line.substr(ind);
    auto col = static_cast<std::uint32_t>(ind + 1);
    if (body[0] == '#') {
      if (body.rfind("# File: ", 0) == 0) origin = parse_origin(body.substr(8));
      else if (body.find("No stacktrace found") != std::string_view::npos) origin = {};
      continue;
    }
    if (!in_forward) {
      if (body.rfind("def forward(", 0) != 0) continue;
      in_forward = true;
      forward_loc = {line_no, col};
      // def forward(self, primals_1: "f32[8]", ...):
      ExprReader r(body, file, line_no, col);
      r.set_pos(12);
      while (!r.peek(')')) {
        Loc nloc = r.loc();
        std::string n = r.ident();
        if (n.empty()) r.fail("expected a parameter name in the signature of forward");
        if (r.peek(':')) {
          r.expect(':');
          if (!r.peek('"') && !r.peek('\'')) r.fail("parameter '" + n + "' has a type that is not a string annotation such as \"f32[8, 16]\"");
          Loc tloc = r.loc();
          Node in;
          in.name = n;
          in.target = "placeholder";
          in.loc = nloc;
          in.type = parse_type(r.string_lit(), file, tloc);
          g.inputs.push_back(std::move(in));
        } else if (n != "self") {
          // def forward(self, primals, tangents): the typed flat inputs follow on the next line
        }
        if (r.peek(',')) r.expect(',');
        else if (!r.peek(')')) r.fail("expected ',' or ')' in the signature of forward");
      }
      continue;
    }
    if (returned) {
      // the module's text may continue (another method, trailing code): only one forward is read
      if (col <= forward_loc.col) break;
      continue;
    }
    if (col <= forward_loc.col) throw ImportError(file, {line_no, col}, "forward ends without a return statement (a truncated file?)");
    if (body.rfind("return", 0) == 0 && (body.size() == 6 || body[6] == ' ' || body[6] == '(' || body[6] == '[')) {
      ExprReader r(body, file, line_no, col);
      r.set_pos(6);
      g.return_loc = {line_no, col};
      if (r.at_end()) {
        returned = true;
        continue;
      }
      PyVal v = r.expr();
      // return pytree.tree_unflatten([a, b, None], self._out_spec)
      if (v.k == PyVal::K::Call && v.s.find("tree_unflatten") != std::string::npos && !v.items.empty()) {
        PyVal first = std::move(v.items[0]);  // not `v = v.items[0]`: that frees the element while copying it
        v = std::move(first);
      }
      if (v.is_seq()) g.outputs = v.items;
      else g.outputs.push_back(v);
      returned = true;
      continue;
    }
    ExprReader r(body, file, line_no, col);
    Loc nloc = r.loc();
    std::string name = r.ident();
    if (name.empty()) r.fail("expected a node `name = ...` or `name: \"type\" = ...`");
    if (r.peek(',')) continue;  // primals_1, primals_2, ... = fx_pytree.tree_flatten_spec(...)
    std::optional<TensorType> type;
    if (r.peek(':')) {
      r.expect(':');
      if (!r.peek('"') && !r.peek('\'')) r.fail("expected a type annotation string after '" + name + ":'");
      Loc tloc = r.loc();
      std::string t = r.string_lit();
      if (r.peek(';')) {
        // primals_1: "f32[1]"; primals_2: "f32[1]"; tangents_1: "f32[1]";  (inputs of a joint graph)
        for (;;) {
          Node in;
          in.name = name;
          in.target = "placeholder";
          in.loc = nloc;
          in.type = parse_type(t, file, tloc);
          g.inputs.push_back(std::move(in));
          r.expect(';');
          if (r.at_end()) break;
          nloc = r.loc();
          name = r.ident();
          if (name.empty()) r.fail("expected an input name in the input declarations");
          r.expect(':');
          tloc = r.loc();
          if (!r.peek('"') && !r.peek('\'')) r.fail("expected a type annotation string after '" + name + ":'");
          t = r.string_lit();
        }
        continue;
      }
      type = parse_type(t, file, tloc);
    }
    r.expect('=');
    PyVal rhs = r.expr();
    // a Python operator on symbolic ints (`sym_size_int >= 0`): a call of operator.<name>
    static const std::pair<const char*, const char*> ops[] = {{">=", "ge"}, {"<=", "le"}, {"==", "eq"}, {"!=", "ne"}, {"//", "floordiv"}, {">", "gt"},
                                                              {"<", "lt"},  {"+", "add"},  {"-", "sub"},  {"*", "mul"},  {"%", "mod"}};
    for (const auto& [tok, nm] : ops) {
      std::string_view rest = r.rest();
      std::size_t k = rest.find_first_not_of(" ");
      if (k == std::string_view::npos || rest.compare(k, std::strlen(tok), tok) != 0) continue;
      r.set_pos(r.pos() + k + std::strlen(tok));
      PyVal call;
      call.k = PyVal::K::Call;
      call.s = std::string("operator.") + nm;
      call.loc = rhs.loc;
      call.items.push_back(std::move(rhs));
      call.items.push_back(r.expr());
      rhs = std::move(call);
      break;
    }
    if (!r.at_end() && !r.peek(';')) r.fail("unexpected text after the node's expression: '" + std::string(r.rest().substr(0, 40)) + "'");
    Node n;
    n.name = name;
    n.loc = nloc;
    n.origin = origin;
    n.type = std::move(type);
    if (rhs.k == PyVal::K::Call) {
      n.target = rhs.s.rfind("torch.ops.", 0) == 0 ? rhs.s.substr(10) : rhs.s;
      n.args = std::move(rhs.items);
      n.kwargs = std::move(rhs.kw);
    } else if (rhs.k == PyVal::K::Index) {
      n.target = "getitem";
      n.args = std::move(rhs.items);
    } else if (rhs.k == PyVal::K::Name && rhs.s.rfind("self.", 0) == 0) {
      n.target = "get_attr";
      PyVal a;
      a.k = PyVal::K::Str;
      a.s = rhs.s.substr(5);
      n.args.push_back(std::move(a));
    } else if (rhs.k == PyVal::K::Name) {
      n.target = "alias";
      n.args.push_back(std::move(rhs));
    } else {
      r.fail("node '" + name + "' is not a call, a tuple element or an attribute");
    }
    g.nodes.push_back(std::move(n));
  }
  if (!in_forward) throw ImportError(file, {line_no ? line_no : 1, 1}, "no `def forward(...)` found: not the text of GraphModule.print_readable()");
  if (!returned) throw ImportError(file, {line_no ? line_no : 1, 1}, "forward ends without a return statement (a truncated file?)");
  for (const auto& in : g.inputs)
    if (!in.type->symbolic.empty())
      throw ImportError(file, in.loc, "input " + in.name + " has the symbolic dim '" + in.type->symbolic + "' (a dynamic shape), which is not supported yet: capture with static shapes");
  return g;
}

}  // namespace spmd::frontends
