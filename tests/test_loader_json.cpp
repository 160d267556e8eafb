// tests/test_loader_json.cpp - the direct JSON path (ir/loader_json.cpp) gives the Program the parse events give.
//
// Every YAML program of the test corpus and the examples is written out as JSON (the form a generator writes)
// and loaded twice, with the direct path and with every item read through the events; the two Programs must
// agree field by field (names and their order, ops, attributes, side tables, expression ids, locations), or
// both loads must fail with the same located message.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/doc.h"
#include "ir/loader.h"
#include "ir/printer.h"
#include "ir/source_file.h"

using namespace spmd;

namespace {

bool json_number(std::string_view s) {
  std::size_t i = 0, n = s.size();
  if (i < n && s[i] == '-') ++i;
  if (i >= n) return false;
  if (s[i] == '0') ++i;
  else if (s[i] >= '1' && s[i] <= '9') while (i < n && s[i] >= '0' && s[i] <= '9') ++i;
  else return false;
  if (i < n && s[i] == '.') {
    if (++i >= n || s[i] < '0' || s[i] > '9') return false;
    while (i < n && s[i] >= '0' && s[i] <= '9') ++i;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (i >= n || s[i] < '0' || s[i] > '9') return false;
    while (i < n && s[i] >= '0' && s[i] <= '9') ++i;
  }
  return i == n;
}

void quote(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  out += '"';
}

// A Doc node as JSON: one op or tensor per line, as generators write them.
void to_json(N n, std::string& out, int depth) {
  if (n.IsMap()) {
    out += '{';
    bool first = true;
    for (auto it = n.begin(); it != n.end(); ++it) {
      N k = *it;
      ++it;
      if (!first) out += ',';
      first = false;
      if (depth <= 1) out += "\n";
      quote(out, k.sv());
      out += ':';
      to_json(*it, out, depth + 1);
    }
    out += '}';
  } else if (n.IsSequence()) {
    out += '[';
    bool first = true;
    for (N x : n) {
      if (!first) out += ',';
      first = false;
      if (depth <= 1) out += "\n";
      to_json(x, out, depth + 1);
    }
    out += ']';
  } else if (n.IsNull()) {
    out += "null";
  } else {
    std::string_view s = n.sv();
    bool quoted = n.doc()->nodes[n.index()].quoted;
    if (!quoted && (json_number(s) || s == "true" || s == "false")) out += s;
    else quote(out, s);
  }
}

std::string loc(Loc l) { return std::to_string(l.line) + ":" + std::to_string(l.col); }

std::string dump(const Program& p) {
  std::ostringstream o;
  o << print_program(p) << "\nnames:";
  for (const auto& n : p.names) o << " " << n;
  o << "\nexprs:" << p.exprs.size() << "\n";
  for (const auto& t : p.tensors) {
    o << "T " << t.name << " " << loc(t.loc) << " " << loc(t.shape_loc) << " " << loc(t.placement_loc) << " [";
    for (auto e : t.shape) o << e << " ";
    for (auto l : t.dim_locs) o << loc(l) << " ";
    o << "] " << static_cast<int>(t.dtype) << t.param << t.uneven;
    for (auto pl : t.placement) o << " " << to_string(pl) << static_cast<int>(pl.ord);
    o << "\n";
  }
  for (const auto& op : p.ops) {
    const OpAttrs& a = op.attrs;
    o << "O " << op_name(op.kind) << " " << loc(op.loc) << " " << int(op.n_in) << "/" << int(op.n_out) << "@" << op.first << " " << a.axes << " "
      << a.dim << " " << a.dim2 << " " << a.rank << " " << a.k << " " << a.dims << " " << a.shape << " " << a.placements << " " << a.coords << " "
      << a.handles << " " << a.sizes << " " << a.bad_axis << " " << a.handle << " " << a.stream << " " << a.group << " " << a.matches << " "
      << a.label << " " << a.sync << " " << a.number << " " << to_string(a.to) << " " << to_string(a.from) << " " << int(a.rop) << " "
      << int(a.dtype) << " " << int(a.reduction) << " " << int(a.layout) << " " << a.has_number << a.has_to << a.has_from << a.has_dtype
      << a.keepdim << a.causal << a.vocab_parallel << a.dropless << a.rng_per_rank << a.dst_invariant << a.inverse << a.uneven << " "
      << int(a.choice) << " " << int(a.order) << "\n";
  }
  o << "operands:";
  for (auto x : p.operands) o << " " << x;
  o << "\nint_lists:";
  for (const auto& l : p.int_lists) {
    o << " [";
    for (int x : l) o << x << ",";
    o << "]";
  }
  o << "\nshapes:";
  for (const auto& l : p.shapes) {
    o << " [";
    for (auto x : l) o << x << ",";
    o << "]";
  }
  o << "\nside: " << p.placement_maps.size() << " " << p.coords.size() << " " << p.name_lists.size() << " " << p.bad_axes.size() << "\n";
  return o.str();
}

std::string load_both(const std::string& text, const std::string& name, bool direct) {
  set_json_direct(direct);
  std::string out;
  try {
    out = dump(load_program_string(text, name));
  } catch (const LoadError& e) {
    out = "error " + loc(e.loc) + " " + e.what();
  }
  set_json_direct(true);
  return out;
}

}  // namespace

TEST_CASE("the direct JSON path gives the Program the parse events give") {
  namespace fs = std::filesystem;
  int files = 0, ok = 0;
  for (const char* dir : {"tests/programs", "tests/bad_input", "examples", "docs/tutorial"}) {
    fs::path root = fs::path(SPMD_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.path().extension() != ".yaml") continue;
      Doc doc;
      try {
        read_document(read_input_file(entry.path().string()), doc);
      } catch (const LoadError&) {
        continue;  // not YAML: nothing to write as JSON
      }
      if (!doc.root().IsMap()) continue;
      std::string json;
      to_json(doc.root(), json, 0);
      json += "\n";
      // Programs that include files resolve them next to the program.
      std::string name = entry.path().string() + ".json";
      std::string a = load_both(json, name, true), b = load_both(json, name, false);
      INFO(entry.path().string());
      CHECK(a == b);
      ++files;
      ok += a.rfind("error", 0) != 0;
    }
  }
  CHECK(files > 100);
  CHECK(ok > 50);
  MESSAGE(files << " files as JSON, " << ok << " loaded");
}

TEST_CASE("the direct JSON path leaves odd items to the events") {
  const std::string head = "{\"mesh\": {\"dp\": 2, \"tp\": 4},\n\"sizes\": {\"B\": 8},\n\"tensors\": {\n";
  const std::vector<std::string> cases = {
      // tensors: placement lists, `order`, expressions, escapes, duplicates, nulls, unknown keys
      "\"x\": {\"shape\": [8, 16], \"placement\": [\"S(0)\", \"R\"]}},\n\"ops\": []}",
      "\"x\": {\"shape\": [8, 16], \"placement\": {\"dp\": \"S(0)\", \"tp\": \"S(0)\", \"order\": [\"tp\", \"dp\"]}}},\n\"ops\": []}",
      "\"x\": {\"shape\": [\"B\", 16], \"placement\": {\"tp\": \"S(-1)\"}}},\n\"ops\": []}",
      "\"x\\u0041\": {\"shape\": [8]}, \"y\": {\"shape\": [8], \"dtype\": \"bf16\", \"param\": true, \"uneven\": false}},\n\"ops\": []}",
      "\"x\": {\"shape\": [8]}, \"x\": {\"shape\": [8]}},\n\"ops\": []}",
      "\"x\": {\"shape\": [8], \"placement\": null}},\n\"ops\": []}",
      "\"x\": {\"shape\": [8], \"placment\": {}}},\n\"ops\": []}",
      "\"x\": {\"shape\": [8], \"placement\": {\"tp\": \"S(1)\"}}},\n\"ops\": []}",
      "\"x\": {\"shape\": [0]}},\n\"ops\": []}",
      // ops: every attribute form, and forms only the events read
      "\"x\": {\"shape\": [8, 16], \"placement\": {\"tp\": \"S(1)\"}}},\n\"ops\": [\n"
      "{\"op\": \"AllGather\", \"in\": \"x\", \"out\": \"y\", \"axis\": [\"tp\"], \"dim\": -1},\n"
      "{\"op\": \"Sum\", \"in\": [\"y\"], \"out\": \"s\", \"dims\": 0, \"keepdim\": \"yes\"},\n"
      "{\"op\": \"Multiply\", \"in\": [\"s\"], \"out\": \"m\", \"scalar\": \"1/tp\"},\n"
      "{\"op\": \"Multiply\", \"in\": [\"m\"], \"out\": \"m2\", \"scalar\": 0.5e1},\n"
      "{\"op\": \"Reshape\", \"in\": [\"y\"], \"out\": \"r\", \"shape\": [\"B\", 4, 4]},\n"
      "{\"op\": \"Reshape\", \"in\": [\"y\"], \"out\": \"r2\", \"shape\": [128]},\n"
      "{\"op\": \"AllReduce\", \"in\": [\"r2\"], \"out\": \"q\", \"axis\": \"pt\"},\n"
      "{\"op\": \"AllReduce\", \"in\": [\"r2\"], \"out\": \"q2\", \"axis\": \"tp\", \"reduce\": \"max\", \"handle\": \"h\"},\n"
      "{\"op\": \"Wait\", \"in\": [\"q2\"], \"out\": \"q3\", \"handle\": \"h\"},\n"
      "{\"op\": \"Convert\", \"in\": \"q3\", \"out\": \"c\", \"axis\": \"tp\", \"to\": \"S(0)\"},\n"
      "{\"use\": \"nothing\"}\n]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"GELU\", \"in\": [\"x\"], \"out\": [\"y\", \"y\"]}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"GELU\", \"in\": [\"x\"], \"out\": \"y\", \"out\": \"z\"}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"GELU\", \"in\": [\"x\"], \"out\": \"y\", \"stream\": \"s1\"}, {\"op\": \"Gelu\", \"in\": \"y\", \"out\": \"z\"}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"Dropout\", \"in\": [\"x\"], \"out\": \"y\", \"p\": 1.5}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"Sum\", \"in\": [\"x\"], \"out\": \"y\"}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"in\": [\"x\"], \"out\": \"y\"}]}",
      "\"x\": {\"shape\": [8]}},\n\"ops\": [{\"op\": \"GELU\", \"in\": [], \"out\": \"y\"}, 5]}",
  };
  for (const auto& c : cases) {
    std::string text = head + c + "\n";
    INFO(text);
    CHECK(load_both(text, "t.json", true) == load_both(text, "t.json", false));
  }
}
