// ir/loader_modules.cpp - modules (named op lists with formal inputs, outputs and parameters), instances,
// `repeat:` and `include:` of module files. Instances expand to plain ops with per-instance names.
#include "ir/loader_impl.h"

#include <filesystem>

#include "ir/source_file.h"

namespace spmd::load_detail {

namespace {

std::vector<std::string> name_list(N n, const std::string& what) {
  std::vector<std::string> out;
  if (!n.IsDefined() || n.IsNull()) return out;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence()) fail(n, what + " must be a list of names");
  for (N x : n) {
    if (!x.IsScalar() || x.sv().empty()) fail(x, what + " must hold names, got " + kind_of(x));
    if (std::find(out.begin(), out.end(), x.sv()) != out.end()) fail(x, what + " names '" + x.Scalar() + "' twice");
    out.push_back(x.Scalar());
  }
  return out;
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `text` with every $name replaced by its parameter's value (parenthesized inside a larger expression).
std::string substitute(N at, std::string_view text, const std::vector<std::pair<std::string, std::string>>& params, const std::string& module) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$') {
      out += text[i];
      continue;
    }
    std::size_t j = i + 1;
    while (j < text.size() && ident_char(text[j])) ++j;
    std::string name(text.substr(i + 1, j - i - 1));
    auto it = std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
    if (it == params.end()) {
      std::vector<std::string> known;
      for (const auto& p : params) known.push_back(p.first);
      fail(at, "unknown parameter '$" + name + "' in module " + module + suggestion(name, known) +
                   (known.empty() ? " (the module declares no `params:`)" : " (params: " + join(known) + ")"));
    }
    bool whole = i == 0 && j == text.size();
    bool simple = std::all_of(it->second.begin(), it->second.end(), ident_char);
    out += whole || simple ? it->second : "(" + it->second + ")";
    i = j - 1;
  }
  return out;
}

std::uint32_t clone(N src, Doc& dst, const std::vector<std::pair<std::string, std::string>>& params, const std::string& module) {
  if (src.IsScalar() || src.IsNull()) {
    std::string_view t = src.sv();
    if (t.find('$') == std::string_view::npos) return dst.add_scalar(src.loc(), t, src.doc()->nodes[src.index()].quoted);
    return dst.add_scalar(src.loc(), substitute(src, t, params, module), true);
  }
  std::uint32_t i = dst.open(src.IsMap() ? NodeKind::Map : NodeKind::Seq, src.loc());
  for (N c : src) clone(c, dst, params, module);
  dst.close(i);
  return i;
}

std::string where(Loc l) { return std::to_string(l.line) + ":" + std::to_string(l.col); }

}  // namespace

void Loader::load_includes(N n) {
  namespace fs = std::filesystem;
  auto canonical = [](const fs::path& path) {
    std::error_code ec;
    std::string c = fs::weakly_canonical(path, ec).string();
    return ec ? path.string() : c;
  };
  auto entries = [](N list) {
    std::vector<N> items;
    if (list.IsScalar())
      items.push_back(list);
    else if (list.IsSequence())
      for (N x : list) items.push_back(x);
    else
      fail(list, "`include` must be a file name or a list of them (relative to this file), e.g. include: [llama_block.yaml]");
    return items;
  };
  // One frame per file on the chain (the program first), walked with an explicit stack: a chain of thousands
  // of files neither overflows the call stack nor canonicalizes a path more than once. A file's own modules
  // are loaded after those of the files it includes.
  struct Frame {
    std::string path, canon;
    std::vector<N> items;
    std::size_t next = 0;
    N modules;
    Loc at;  // its entry in the file before it
  };
  std::vector<Frame> stack;
  std::unordered_map<std::string, std::size_t> on_stack;  // canonical path -> frame
  stack.push_back({file_, canonical(file_), {}, 0, N(), {}});
  on_stack[stack.back().canon] = 0;
  try {
    stack.back().items = entries(n);
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next == f.items.size()) {
        if (stack.size() > 1 && f.modules.IsDefined() && !f.modules.IsNull()) load_modules(f.modules, f.path);
        on_stack.erase(f.canon);
        stack.pop_back();
        continue;
      }
      N x = f.items[f.next++];
      if (!x.IsScalar() || x.sv().empty()) fail(x, "`include` must list file names, got " + kind_of(x));
      if (stack.size() == 1) include_at_ = x.loc();
      fs::path path = fs::path(f.path).parent_path() / x.Scalar();
      std::string canon = canonical(path);
      if (auto c = on_stack.find(canon); c != on_stack.end()) {
        std::string chain;
        for (std::size_t j = c->second; j < stack.size(); ++j) chain += fs::path(stack[j].path).filename().string() + " includes ";
        fail(x, "include cycle: " + chain + x.Scalar() + " again; a module file cannot include itself");
      }
      // A file reached twice (two files include a third) is read once: its modules are the same modules.
      if (!included_.insert(canon).second) continue;
      std::string text;
      try {
        text = read_input_file(path.string(), kMaxInputBytes - include_bytes_);
      } catch (const LoadError& e) {
        fail(x, std::string("cannot include: ") + e.what() + (include_bytes_ ? " (the limit counts every included file)" : ""));
      }
      include_bytes_ += text.size();
      stack.push_back({path.string(), canon, {}, 0, N(), x.loc()});
      on_stack[canon] = stack.size() - 1;
      auto& doc = *docs_.emplace_back(std::make_unique<Doc>());
      read_document(text, doc);
      N root = doc.root();
      if (!root.IsMap()) fail(root.IsDefined() ? root : N(), "an included file must be a program (a mapping) with `modules:`");
      // An included file is a program of its own (it may test its modules); only its modules are taken.
      for_each_key(root, kTopKeys, "the program", [](N, N) {});
      if (N inc = root["include"]; inc.IsDefined()) stack.back().items = entries(inc);
      stack.back().modules = root["modules"];
    }
  } catch (const LoadError& e) {
    // At the program's entry, with the position in each file on the way: "in a.yaml:2:10: in b.yaml:3:1: ...".
    if (stack.size() <= 1) throw;
    const std::size_t d = stack.size() - 1;
    std::string chain;
    for (std::size_t i = 1; i <= d; ++i) {
      if (d > 6 && i == 3) chain += "... (" + std::to_string(d - 5) + " more included files): ", i = d - 2;
      Loc l = i < d ? stack[i + 1].at : e.loc.line ? e.loc : Loc{1, 1};
      chain += "in " + stack[i].path + ":" + where(l) + ": ";
    }
    throw LoadError(stack[1].at, chain + e.what());
  }
}

void Loader::load_modules(N n, const std::string& file) {
  if (!n.IsMap()) fail(n, "`modules` must be a mapping of name -> {in: [...], out: [...], ops: [...]}");
  for_each_key(n, {}, "`modules`", [&](N k, N v) {
    std::string name = k.Scalar();
    if (modules_.count(name))
      fail(k, "module '" + name + "' is defined twice" + (modules_[name].file.empty() ? "" : " (also in " + modules_[name].file + ")"));
    if (!v.IsMap()) fail(v.IsNull() ? k : v, "module '" + name + "' must be a mapping like {in: [x], out: [y], ops: [...]}");
    for_each_key(v, {"description", "in", "out", "params", "tensors", "ops"}, "module '" + name + "'", [](N, N) {});
    Module m;
    m.name = name;
    m.node = k;
    m.in = v["in"], m.out = v["out"], m.params = v["params"], m.tensors = v["tensors"], m.ops = v["ops"];
    m.file = file;
    m.include_at = include_at_;
    if (!m.ops.IsDefined()) fail(k, "module '" + name + "' needs `ops`");
    if (!m.ops.IsSequence() && !m.ops.IsNull()) fail(m.ops, "`ops` of module '" + name + "' must be a list of ops");
    auto ins = name_list(m.in, "`in` of module '" + name + "'");
    auto outs = name_list(m.out, "`out` of module '" + name + "'");
    for (N o : m.out.IsSequence() ? m.out : N())
      if (std::find(ins.begin(), ins.end(), o.sv()) != ins.end())
        fail(o, "module '" + name + "' has '" + o.Scalar() + "' as both an input and an output (outputs are new tensors)");
    name_list(m.params, "`params` of module '" + name + "'");
    if (m.tensors.IsDefined() && !m.tensors.IsNull() && !m.tensors.IsMap())
      fail(m.tensors, "`tensors` of module '" + name + "' must be a mapping of name -> {shape, placement, ...}");
    modules_.emplace(name, std::move(m));
  });
}

void Loader::check_module_graph() {
  // Modules in the order they are written, so the first cycle reported is the first in the file.
  std::vector<Module*> order;
  for (auto& [name, m] : modules_) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const Module* a, const Module* b) {
    Loc la = a->node.loc(), lb = b->node.loc();
    return std::tie(a->file, la.line, la.col) < std::tie(b->file, lb.line, lb.col);
  });
  for (std::size_t i = 0; i < order.size(); ++i) order[i]->index = static_cast<int>(i);
  // The `use:` items of each module body (a `$param` target is only known when an instance expands it).
  struct Edge {
    int to;
    N use;
    std::int64_t times;
  };
  std::vector<std::vector<Edge>> edges(order.size());
  for (Module* m : order) {
    m->size = 0;
    if (!m->ops.IsSequence()) continue;
    for (N item : m->ops) {
      ++m->size;  // an op, or an instance of a module not known here
      if (!item.IsMap() || item.key_node("op").IsDefined()) continue;
      N use = item["use"];
      if (!use.IsScalar() || use.sv().find('$') != std::string_view::npos) continue;
      auto it = modules_.find(use.Scalar());
      if (it == modules_.end()) continue;  // reported when an instance expands it
      --m->size;                           // counted with its instances below
      std::int64_t times = 1;
      if (N r = item["repeat"]; !r.IsScalar() || !parse_int(r.sv(), times) || times < 1) times = 1;
      edges[static_cast<std::size_t>(m->index)].push_back({it->second.index, use, times});
    }
  }
  // Depth-first with an explicit stack (a chain of thousands of modules must not overflow the call stack); a
  // module is done when everything it uses is done, so its size is known then (saturated just above the limit).
  constexpr std::int64_t cap = kMaxExpansion + 1;
  std::vector<std::uint8_t> state(order.size(), 0);  // 0 unseen, 1 on the stack, 2 done
  struct Frame {
    int m;
    std::size_t next;
  };
  std::vector<Frame> stack;
  for (std::size_t root = 0; root < order.size(); ++root) {
    if (state[root]) continue;
    stack.push_back({static_cast<int>(root), 0});
    state[root] = 1;
    while (!stack.empty()) {
      const int at = stack.back().m;
      const auto& es = edges[static_cast<std::size_t>(at)];
      Module& m = *order[static_cast<std::size_t>(at)];
      if (stack.back().next == es.size()) {
        for (const Edge& e : es) {
          std::int64_t one = std::min(cap, 1 + order[static_cast<std::size_t>(e.to)]->size);
          m.size = e.times > cap / one ? cap : std::min(cap, m.size + e.times * one);
        }
        state[static_cast<std::size_t>(at)] = 2;
        stack.pop_back();
        continue;
      }
      const Edge& e = es[stack.back().next++];
      if (state[static_cast<std::size_t>(e.to)] == 1) {
        auto from = std::find_if(stack.begin(), stack.end(), [&](const Frame& x) { return x.m == e.to; });
        const auto n = static_cast<std::size_t>(stack.end() - from);
        std::string chain;
        for (std::size_t i = 0; i < n; ++i) {
          if (n > 8 && i == 3) chain += "... (" + std::to_string(n - 6) + " more) -> ", i = n - 3;
          chain += order[static_cast<std::size_t>(from[static_cast<std::ptrdiff_t>(i)].m)]->name + " -> ";
        }
        const std::string& to = order[static_cast<std::size_t>(e.to)]->name;
        std::string msg = "module '" + to + "' uses itself (" + chain + to + "); modules cannot recurse, even a module no op uses";
        if (m.file.empty()) fail(e.use, msg);
        fail_at(m.include_at, "in " + m.file + ":" + where(e.use.loc()) + ": " + msg);
      }
      if (state[static_cast<std::size_t>(e.to)] == 0) {
        state[static_cast<std::size_t>(e.to)] = 1;
        stack.push_back({e.to, 0});
      }
    }
  }
}

void Loader::load_instance(N item) {
  for_each_key(item, {"use", "in", "out", "name", "with", "repeat"}, "a module instance", [](N, N) {});
  N use = item["use"];
  if (!use.IsDefined()) fail(item, "a `repeat` needs `use: <module>` (the module it repeats)");
  if (!use.IsScalar()) fail(use, "`use` must name a module");
  auto it = modules_.find(use.Scalar());
  if (it == modules_.end()) {
    std::vector<std::string> names;
    for (const auto& [n, m] : modules_) names.push_back(n);
    std::sort(names.begin(), names.end());
    fail(use, "unknown module '" + use.Scalar() + "'" + suggestion(use.Scalar(), names) +
                  (names.empty() ? " (declare it under `modules:`, or `include:` a file that does)" : " (modules: " + join(names) + ")"));
  }
  Module& m = it->second;
  if (m.expanding) fail(use, "module '" + m.name + "' uses itself (directly or through other modules); modules cannot recurse");
  if (scopes_.size() >= static_cast<std::size_t>(kMaxModuleDepth))
    fail(use, "module instances nest more than " + std::to_string(kMaxModuleDepth) + " levels deep (the limit): module " + m.name +
                  " is used inside " + std::to_string(scopes_.size()) + " instances");
  std::int64_t times = 1;
  bool repeat = item.key_node("repeat").IsDefined();
  if (repeat) times = attr_int(item["repeat"], "`repeat`", 1, 1'000'000);
  // Bounded before anything is expanded: nested `repeat` multiplies, and a module of no ops still costs an instance.
  std::int64_t one = std::min(kMaxExpansion + 1, 1 + m.size);
  if (times > (kMaxExpansion - expanded_) / one)
    fail(repeat ? item["repeat"] : use,
         (repeat ? std::to_string(times) + " instances of module " + m.name + " expand" : "an instance of module " + m.name + " expands") +
             (one > kMaxExpansion ? " to more ops and instances than" : " to " + std::to_string(times * one) + " ops and instances, more than") +
             " the limit of " + std::to_string(kMaxExpansion) + " for modules" +
             (expanded_ ? " (with the " + std::to_string(expanded_) + " expanded before)" : "") + "; expand fewer layers, or write the ops out");
  auto formal_in = name_list(m.in, "`in`"), formal_out = name_list(m.out, "`out`");
  auto ins = load_names(item["in"], "`in` of the instance of " + m.name, true);
  auto outs = load_names(item["out"], "`out` of the instance of " + m.name, true);
  auto count = [&](std::size_t got, std::size_t want, const char* key) {
    if (got != want)
      fail(item[key].IsDefined() ? item[key] : item, "module " + m.name + " takes " + std::to_string(want) + " " +
                                                          (key[0] == 'i' ? "input" : "output") + (want == 1 ? "" : "s") + " (" +
                                                          join(key[0] == 'i' ? formal_in : formal_out) + "), got " + std::to_string(got));
  };
  count(ins.size(), formal_in.size(), "in");
  count(outs.size(), formal_out.size(), "out");
  if (repeat && formal_out.size() > formal_in.size())
    fail(item.key_node("repeat"), "module " + m.name + " has more outputs than inputs, so its instances cannot be chained by `repeat` "
                                  "(instance k+1 reads instance k's outputs as its first inputs)");
  std::vector<std::pair<std::string, std::string>> params;
  auto formal_params = name_list(m.params, "`params`");
  N with = item["with"];
  if (with.IsDefined() && !with.IsNull()) {
    if (!with.IsMap()) fail(with, "`with` must be a mapping of parameter -> value, e.g. with: {ffn: F}");
    for_each_key(with, formal_params, "`with` of module " + m.name, [&](N k, N v) {
      if (!v.IsScalar()) fail(v, "parameter " + k.Scalar() + " of module " + m.name + " must be a scalar (a size, a name, a number)");
      params.emplace_back(k.Scalar(), v.Scalar());
    });
  }
  for (const auto& f : formal_params)
    if (std::none_of(params.begin(), params.end(), [&](const auto& p) { return p.first == f; }))
      fail(with.IsDefined() ? with : item, "the instance of module " + m.name + " needs parameter `" + f + "` (with: {" + f + ": ...})");
  std::string base = item["name"].IsDefined() ? item["name"].Scalar() : m.name;
  if (base.empty() || base.find('.') != std::string::npos)
    fail(item["name"], "`name` of an instance must be a plain name without dots");
  std::string prefix = (scopes_.empty() ? "" : scopes_.back().prefix + ".") + base;
  if (!prefixes_.insert(prefix).second)
    fail(item.key_node("name").IsDefined() ? item["name"] : use,
         "a second instance named '" + prefix + "': give this one its own `name:` (its tensors are named " + prefix + ".<name>)");
  if (!repeat) return instantiate(m, item, prefix, ins, outs, params, "instance '" + prefix + "' of module " + m.name);
  std::vector<NameId> cur_in = ins;
  for (std::int64_t k = 0; k < times; ++k) {
    std::string pk = prefix + "." + std::to_string(k);
    std::vector<NameId> cur_out;
    for (std::size_t j = 0; j < formal_out.size(); ++j) cur_out.push_back(k + 1 == times ? outs[j] : p_.intern(pk + "." + formal_out[j]));
    instantiate(m, item, pk, cur_in, cur_out, params,
                "layer " + std::to_string(k) + " of " + std::to_string(times) + " ('" + pk + "', module " + m.name + ", numbered from 0)");
    for (std::size_t j = 0; j < cur_out.size(); ++j) cur_in[j] = cur_out[j];
  }
}

void Loader::instantiate(Module& m, N item, const std::string& prefix, const std::vector<NameId>& ins, const std::vector<NameId>& outs,
                         const std::vector<std::pair<std::string, std::string>>& params, const std::string& label) {
  if (instance_at_.empty()) {
    // The first instance: from now on the program's own names are tracked, so an instance cannot take one.
    for (const TensorDecl& t : p_.tensors) claim_program_name(t.name);
    for (const Op& op : p_.ops)
      for (NameId o : p_.outs(op)) claim_program_name(o);
  }
  if (++expanded_ > kMaxExpansion) fail(item, "modules expand to more than " + std::to_string(kMaxExpansion) + " ops and instances (the limit)");
  Scope s;
  s.prefix = prefix;
  s.module = &m;
  s.serial = static_cast<std::uint32_t>(instance_at_.size());
  instance_at_.push_back(item.loc());
  auto formal_in = name_list(m.in, "`in`"), formal_out = name_list(m.out, "`out`");
  for (std::size_t j = 0; j < formal_in.size(); ++j) s.formals.emplace(formal_in[j], ins[j]);
  for (std::size_t j = 0; j < formal_out.size(); ++j) s.formals.emplace(formal_out[j], outs[j]);
  N tensors = m.tensors, ops = m.ops;
  Doc body;
  if (!params.empty()) {
    std::uint32_t t = m.tensors.IsDefined() ? clone(m.tensors, body, params, m.name) : 0;
    std::uint32_t o = clone(m.ops, body, params, m.name);
    if (m.tensors.IsDefined()) tensors = body.at(t);
    ops = body.at(o);
  }
  bool top = target_ == &p_.ops;
  auto first = static_cast<std::uint32_t>(p_.ops.size());
  m.expanding = true;
  scopes_.push_back(std::move(s));
  try {
    if (tensors.IsDefined() && !tensors.IsNull()) load_tensors(tensors);
    if (ops.IsSequence())
      for (N op : ops) load_item(op);
  } catch (const LoadError& e) {
    m.expanding = false;
    scopes_.pop_back();
    // The innermost instance names the whole path ('outer.inner'); the ones around it only move the position
    // into their own file, so a message stays one line however deep the modules nest.
    const bool named = wrapped_;
    wrapped_ = true;
    if (!m.file.empty()) throw LoadError(item.loc(), "in " + m.file + ":" + where(e.loc) + ": " + e.what() + (named ? "" : " (in " + label + ")"));
    if (named) throw;
    throw LoadError(e.loc, std::string(e.what()) + " (in " + label + ", expanded at line " + std::to_string(item.loc().line) + ")");
  }
  scopes_.pop_back();
  m.expanding = false;
  ++m.uses;
  if (top) p_.instances.push_back({first, static_cast<std::uint32_t>(p_.ops.size()), item.loc(), label, m.file});
}

void Loader::claim_program_name(NameId id) {
  if (owner_.size() <= static_cast<std::size_t>(id)) owner_.resize(std::max<std::size_t>(static_cast<std::size_t>(id) + 1, owner_.size() * 2), 0);
  if (!owner_[static_cast<std::size_t>(id)]) owner_[static_cast<std::size_t>(id)] = 1;
}

void Loader::claim(NameId id, N at, std::string_view written) {
  const std::uint32_t me = 2 + scopes_.back().serial;
  if (owner_.size() <= static_cast<std::size_t>(id)) owner_.resize(std::max<std::size_t>(static_cast<std::size_t>(id) + 1, owner_.size() * 2), 0);
  std::uint32_t& o = owner_[static_cast<std::size_t>(id)];
  if (o == 0)
    o = me;
  else if (o != me)
    clash(id, at, written);
}

void Loader::clash(NameId id, N at, std::string_view written) {
  const Scope& s = scopes_.back();
  const std::uint32_t o = owner_[static_cast<std::size_t>(id)];
  std::string other;
  if (o >= 2) {
    other = "a name of the instance expanded at line " + std::to_string(instance_at_[o - 2].line);
  } else {
    Loc l{};
    for (const TensorDecl& t : p_.tensors)
      if (t.name == id && !l.line) l = t.loc, other = "the program's tensor declared at line " + std::to_string(l.line);
    for (const Op& op : p_.ops)
      for (NameId x : p_.outs(op))
        if (x == id && !l.line)
          l = op.loc, other = "written by the program's " + std::string(op_name(op.kind)) + " at line " + std::to_string(l.line);
    if (other.empty()) other = "a name of the program";
  }
  fail(at, "'" + p_.name(id) + "' (the name '" + std::string(written) + "' of instance '" + s.prefix + "' of module " + s.module->name +
               ") is also " + other + ": the two would silently be one tensor; rename one (an instance's own names are '<instance>.<name>')");
}

}  // namespace spmd::load_detail
