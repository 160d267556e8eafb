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

void Loader::load_includes(N n, std::vector<std::string>& stack) {
  std::vector<N> items;
  if (n.IsScalar()) items.push_back(n);
  else if (n.IsSequence()) for (N x : n) items.push_back(x);
  else fail(n, "`include` must be a file name or a list of them (relative to this file), e.g. include: [llama_block.yaml]");
  namespace fs = std::filesystem;
  for (N x : items) {
    if (!x.IsScalar() || x.sv().empty()) fail(x, "`include` must list file names, got " + kind_of(x));
    fs::path path = fs::path(stack.back()).parent_path() / x.Scalar();
    std::error_code ec;
    std::string canon = fs::weakly_canonical(path, ec).string();
    if (ec) canon = path.string();
    for (std::size_t i = 0; i < stack.size(); ++i) {
      std::error_code ec2;
      std::string other = fs::weakly_canonical(stack[i], ec2).string();
      if (other != canon) continue;
      std::string chain;
      for (std::size_t j = i; j < stack.size(); ++j) chain += fs::path(stack[j]).filename().string() + " includes ";
      fail(x, "include cycle: " + chain + x.Scalar() + " again; a module file cannot include itself");
    }
    std::string text;
    try {
      text = read_input_file(path.string());
    } catch (const LoadError& e) {
      fail(x, std::string("cannot include: ") + e.what());
    }
    auto& doc = *docs_.emplace_back(std::make_unique<Doc>());
    try {
      read_document(text, doc);
      N root = doc.root();
      if (!root.IsMap()) fail(root.IsDefined() ? root : N(), "an included file must be a program (a mapping) with `modules:`");
      // An included file is a program of its own (it may test its modules); only its modules are taken.
      for_each_key(root, kTopKeys, "the program", [](N, N) {});
      stack.push_back(path.string());
      if (auto inc = root["include"]; inc.IsDefined()) load_includes(inc, stack);
      if (auto mods = root["modules"]; mods.IsDefined() && !mods.IsNull()) load_modules(mods, path.string());
      stack.pop_back();
    } catch (const LoadError& e) {
      throw LoadError(x.loc(), "in " + path.string() + (e.loc.line ? ":" + where(e.loc) : "") + ": " + e.what());
    }
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
  std::int64_t times = 1;
  bool repeat = item.key_node("repeat").IsDefined();
  if (repeat) times = attr_int(item["repeat"], "`repeat`", 1, 1'000'000);
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
  Scope s;
  s.prefix = prefix;
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
    if (!m.file.empty()) throw LoadError(item.loc(), "in " + m.file + ":" + where(e.loc) + ": " + e.what() + " (in " + label + ")");
    throw LoadError(e.loc, std::string(e.what()) + " (in " + label + ", expanded at line " + std::to_string(item.loc().line) + ")");
  }
  scopes_.pop_back();
  m.expanding = false;
  ++m.uses;
  if (top) p_.instances.push_back({first, static_cast<std::uint32_t>(p_.ops.size()), item.loc(), label, m.file});
}

}  // namespace spmd::load_detail
