// tests/test_loader.cpp - located errors for malformed programs (the corpus in tests/bad_input covers more).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/printer.h"
#include "ir/source_file.h"
#include "tests/helpers.h"

using namespace spmd;
using namespace spmd::test;

TEST_CASE("load errors are located and suggest names") {
  Loc l;
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: Matmul, in: [a, b], out: c}\n", &l).find("did you mean 'MatMul'?") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(l.col == 10);
  CHECK(load_error("mesh: {tp: 2}\nopz: []\n", &l).find("did you mean 'ops'?") != std::string::npos);
  CHECK(l.line == 2);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllGather, in: [a], out: b, axis: tp, dimm: 0}\n", &l).find("did you mean 'dim'?") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllGather, in: [a], out: b, axis: tp}\n", &l).find("needs attribute `dim`") != std::string::npos);
  // An axis the mesh lacks is an illegal-collective finding (contract section 3), not a load error.
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: AllReduce, in: [a], out: b, axis: pt}\n").empty());
  auto bad_axis = diags("mesh: {tp: 2}\ntensors:\n  a: {shape: [4], placement: {tp: P}}\nops:\n  - {op: AllReduce, in: [a], out: b, axis: pt}\n");
  REQUIRE(bad_axis.size() == 1);
  CHECK(check_name(bad_axis[0].id) == "illegal-collective");
  CHECK(bad_axis[0].message.find("did you mean 'tp'?") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: S(2)}}\nops: []\n", &l).find("out of range") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(load_error("mesh: {tp: 0}\nops: []\n", &l).find("positive") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [1099511627777]}\nops: []\n", &l).find("too large") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntensors:\n  x: {shape: [1099511627776, 1099511627776]}\nops: []\n", &l).find("too many elements") !=
        std::string::npos);
  CHECK(load_error("mesh: {tp: 2\nops: []\n", &l).find("invalid YAML") != std::string::npos);
  CHECK(load_error("", &l).find("empty program") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nprograms: []\n", &l).find("non-empty list") != std::string::npos);
  CHECK(load_error("mesh: {pp: 2}\nschedule: {kind: GPipe, microbatches: 2}\nops: []\n", &l).find("instead of `ops`") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\ntrain: true\nops: []\n", &l).find("loss") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-misuse, shape-mismatch]\n").empty());
  CHECK(load_error("mesh: {tp: 2}\nops: []\nexpect: [partial-mis]\n").find("did you mean 'partial-misuse'?") != std::string::npos);
  // Deep nesting is refused by the parser, not by a stack overflow.
  CHECK_FALSE(load_error("mesh: {tp: 2}\nops: " + std::string(100000, '[') + "\n", &l).empty());
}

TEST_CASE("hostile inputs get located errors, never a crash or a hang") {
  Loc l;
  // 150,000 chained products: bounded depth, not a stack overflow.
  std::string chain = "mesh: {tp: 1}\nsizes: {H: {max: 2}}\ntensors: {x: {shape: [H";
  for (int i = 0; i < 150000; ++i) chain += "*H";
  chain += "]}}\nops: []\n";
  CHECK(load_error(chain, &l).find("too large") != std::string::npos);
  CHECK(l.line == 3);
  // 150,000 chained subtractions fold into one term as they are read (H - 150000): no depth at all.
  std::string folded = "mesh: {tp: 1}\nsizes: {H: {max: 2}}\ntensors: {x: {shape: [H";
  for (int i = 0; i < 150000; ++i) folded += "-1";
  folded += "]}}\nops: []\n";
  CHECK(load_error(folded, &l).empty());
  Program fp = load_program_string(folded, "folded.yaml");
  CHECK(fp.exprs.str(fp.tensors[0].shape[0], fp.vars) == "H - 150000");
  // Named sizes that multiply out exponentially: bounded size, not an exponential walk.
  std::string blowup = "mesh: {tp: 1}\nsizes:\n  A: {max: 2}\n";
  const char* names = "ABCDEFGHIJK";
  for (int i = 1; i < 11; ++i) {
    blowup += std::string("  ") + names[i] + ": ";
    for (int k = 0; k < 10; ++k) blowup += std::string(k ? "*" : "") + names[i - 1];
    blowup += "\n";
  }
  blowup += "tensors: {x: {shape: [K]}}\nops: []\n";
  CHECK(load_error(blowup).find("too large") != std::string::npos);
  // A mesh of 2^80 ranks.
  CHECK(load_error("mesh: {a: 1048576, b: 1048576, c: 1048576, d: 1048576}\nops: []\n").find("more than 2^31 ranks") != std::string::npos);
  // Did-you-mean on huge names stays cheap.
  std::string long_axis(20000, 'a'), long_typo(20000, 'b');
  CHECK(load_error("mesh:\n  ? " + long_axis + "\n  : 2\ntensors:\n  x:\n    shape: [4]\n    placement:\n      ? " + long_typo + "\n      : S(0)\nops: []\n")
            .find("which the mesh lacks") != std::string::npos);
  // Multiplying by zero is a zero dim.
  CHECK(load_error("mesh: {tp: 1}\nsizes: {H: {min: 1}}\ntensors: {x: {shape: [0*H]}}\nops: []\n").find("positive") != std::string::npos);
  // A second YAML document and an unclosed quote.
  CHECK(load_error("mesh: {tp: 2}\nops: []\n---\nmesh: {tp: 4}\n", &l).find("one YAML document") != std::string::npos);
  CHECK(l.line == 3);
  CHECK(load_error("# a comment\n---\nmesh: {tp: 2}\nops: []\n---\nmesh: {tp: 4}\n", &l).find("one YAML document") != std::string::npos);
  CHECK(l.line == 5);  // a leading document marker is not the second document
  CHECK(load_error("mesh: {tp: 2}\nname: \"oops\nops: []\n", &l).find("never closed") != std::string::npos);
  CHECK(l.line == 2);
}

TEST_CASE("products of symbolic sizes are proved without the solver timing out") {
  // B*S with B a multiple of 8 is even for every value; Z3's nonlinear arithmetic alone gives up here.
  CHECK(ids("mesh: {tp: 2}\nsizes: {B: {min: 8, multiple_of: 8}, S: {min: 128, multiple_of: 128}}\n"
            "tensors:\n  a: {shape: [B*S, 64], placement: {tp: S(0)}}\nops: []\n")
            .empty());
  CHECK(ids("mesh: {tp: 16}\nsizes: {B: {min: 8, multiple_of: 8}, S: {min: 1}}\n"
            "tensors:\n  a: {shape: [B*S, 64], placement: {tp: S(0)}}\nops: []\n") == std::set<std::string>{"shape-mismatch"});
}

TEST_CASE("JSON and YAML load to the same program, with the same located errors") {
  std::string yaml = "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: S(1)}}\nops:\n  - {op: GELU, in: [x], out: y}\n";
  std::string json = "{\"mesh\": {\"tp\": 2},\n \"tensors\": {\"x\": {\"shape\": [4, 8], \"placement\": {\"tp\": \"S(1)\"}}},\n"
                     " \"ops\": [{\"op\": \"GELU\", \"in\": [\"x\"], \"out\": \"y\"}]}\n";
  Program a = load_program_string(yaml, "a.yaml"), b = load_program_string(json, "b.json");
  CHECK(print_program(a) == print_program(b));
  CHECK(b.ops[0].loc.line == 3);
  CHECK(b.ops[0].loc.col == 10);
  Loc l;
  CHECK(load_error("{\"mesh\": {\"tp\": 2},\n \"ops\": [{\"op\": \"Gelu\", \"in\": [\"x\"], \"out\": \"y\"}]}\n", &l).find("did you mean 'GELU'?") !=
        std::string::npos);
  CHECK(l.line == 2);
  CHECK(l.col == 17);
  // JSON escapes and flow YAML that is not JSON (plain keys) both load.
  CHECK(load_program_string("{\"mesh\": {\"t\\u0070\": 2}, \"ops\": []}", "c.json").mesh[0].name == "tp");
  CHECK(load_program_string("{mesh: {tp: 2}, ops: []}", "d.yaml").mesh.size() == 1);
  // A JSON syntax error is reported by the YAML parser at its position.
  CHECK(load_error("{\"mesh\": {\"tp\": 2},\n \"ops\": [}\n", &l).find("invalid YAML") != std::string::npos);
  CHECK(l.line == 2);
}

TEST_CASE("keys in any order load the same program as the streaming order") {
  std::string in_order = "mesh: {tp: 2}\nsizes: {B: 4}\ntensors:\n  x: {shape: [B, 8]}\nops:\n  - {op: GELU, in: [x], out: y}\noutputs:\n  y: {}\n";
  std::string reordered = "ops:\n  - {op: GELU, in: [x], out: y}\noutputs:\n  y: {}\ntensors:\n  x: {shape: [B, 8]}\nmesh: {tp: 2}\nsizes: {B: 4}\n";
  CHECK(print_program(load_program_string(in_order, "a.yaml")) == print_program(load_program_string(reordered, "b.yaml")));
  // An error after streamed ops is reported as in the fixed order: the unknown top-level key first.
  Loc l;
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: Gelu, in: [x], out: y}\nopz: 1\n", &l).find("unknown key 'opz'") != std::string::npos);
  CHECK(l.line == 4);
  CHECK(load_error("mesh: {tp: 2}\nops:\n  - {op: GELU, in: [x], out: y}\n---\nmesh: {tp: 4}\n", &l).find("one YAML document") != std::string::npos);
}

TEST_CASE("modules, repeat and include expand to plain ops with per-instance names") {
  std::string text =
      "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8]}\n  s: {shape: [8]}\nmodules:\n  m:\n    in: [a, k]\n    out: [b]\n"
      "    tensors: {w: {shape: [8, 8]}}\n    ops:\n      - {op: MatMul, in: [a, w], out: t}\n      - {op: Multiply, in: [t, k], out: b}\n"
      "ops:\n  - {repeat: 3, use: m, name: L, in: [x, s], out: [y]}\n  - {use: m, in: [y, s], out: [z]}\n";
  Program p = load_program_string(text, "t.yaml");
  REQUIRE(p.ops.size() == 8);
  CHECK(p.name(p.ins(p.ops[0])[0]) == "x");
  CHECK(p.name(p.ins(p.ops[0])[1]) == "L.0.w");
  CHECK(p.name(p.outs(p.ops[1])[0]) == "L.0.b");
  CHECK(p.name(p.ins(p.ops[2])[0]) == "L.0.b");      // layer 1 reads layer 0's output
  CHECK(p.name(p.ins(p.ops[3])[1]) == "s");          // the shared input
  CHECK(p.name(p.outs(p.ops[5])[0]) == "y");         // the last layer writes the actual output
  CHECK(p.name(p.ins(p.ops[6])[1]) == "m.w");        // a single instance is named after its module
  CHECK(p.ops[2].loc.line == 11);                    // positions inside the module
  CHECK(p.tensors.size() == 2 + 4);
  REQUIRE(p.instances.size() == 4);
  CHECK(p.instances[1].label.find("layer 1 of 3") != std::string::npos);
  CHECK(ids(text).empty());
  // The printer writes the expanded program, which loads back to the same program.
  CHECK(print_program(load_program_string(print_program(p), "r.yaml")) == print_program(p));
  Loc l;
  // A second unnamed instance of the same module, a module that uses itself, a missing parameter.
  CHECK(load_error(text + "  - {use: m, in: [z, s], out: [z2]}\n", &l).find("give this one its own `name:`") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nmodules:\n  m: {in: [a], out: [b], ops: [{use: m, in: [a], out: [b]}]}\ntensors: {x: {shape: [4]}}\n"
                   "ops: [{use: m, in: [x], out: [y]}]\n")
            .find("uses itself") != std::string::npos);
  CHECK(load_error("mesh: {tp: 2}\nmodules:\n  m: {params: [F], in: [a], out: [b], ops: [{op: GELU, in: [a], out: b}]}\n"
                   "tensors: {x: {shape: [4]}}\nops: [{use: m, in: [x], out: [y]}]\n")
            .find("needs parameter `F`") != std::string::npos);
}

TEST_CASE("include takes another file's modules; errors inside it say where") {
  auto dir = std::filesystem::temp_directory_path() / "spmd_include_test";
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  write("lib.yaml", "modules:\n  g: {in: [a], out: [b], ops: [{op: GELU, in: [a], out: b}]}\n");
  write("bad_lib.yaml", "modules:\n  g: {in: [a], out: [b], ops: [{op: Gelu, in: [a], out: b}]}\n");
  std::string main = write("main.yaml", "mesh: {tp: 2}\ninclude: lib.yaml\ntensors: {x: {shape: [4]}}\nops: [{use: g, in: [x], out: [y]}]\n");
  Program p = load_program_file(main);
  REQUIRE(p.ops.size() == 1);
  REQUIRE(p.instances.size() == 1);
  CHECK(p.instances[0].file.find("lib.yaml") != std::string::npos);
  std::string bad = write("bad.yaml", "mesh: {tp: 2}\ninclude: bad_lib.yaml\ntensors: {x: {shape: [4]}}\nops: [{use: g, in: [x], out: [y]}]\n");
  try {
    load_program_file(bad);
    CHECK(false);
  } catch (const LoadError& e) {
    CHECK(e.loc.line == 4);  // the instance, in this file
    CHECK(std::string(e.what()).find("bad_lib.yaml:2:37: unknown op 'Gelu'") != std::string::npos);
  }
}

TEST_CASE("repeat of a module that declares tensors: expands in linear time (each instance copied the whole list: 50,000 took about 17 s)") {
  const std::string text =
      "mesh: {tp: 2}\ntensors: {x: {shape: [4, 8]}}\nmodules:\n  m:\n    in: [a]\n    out: [b]\n    tensors: {w: {shape: [4, 8]}}\n"
      "    ops: [{op: Add, in: [a, w], out: b}]\nops:\n  - {repeat: 50000, use: m, name: l, in: [x], out: [y]}\n";
  Program p = load_program_string(text, "t.yaml");
  CHECK(p.ops.size() == 50'000);
  CHECK(p.tensors.size() == 1 + 50'000);
  CHECK(p.name(p.ins(p.ops[49'999])[1]) == "l.49999.w");
}

TEST_CASE("module graphs: recursion, depth and size are bounded before anything is expanded") {
  auto chain = [](int n, bool cycle, int use) {
    std::string t = "mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n";
    for (int i = 0; i < n; ++i)
      t += "  m" + std::to_string(i) + ": {in: [a], out: [b], ops: [{use: m" + std::to_string(cycle ? (i + 1) % n : i + 1) +
           ", in: [a], out: [b]}]}\n";
    if (!cycle) t += "  m" + std::to_string(n) + ": {in: [a], out: [b], ops: [{op: GELU, in: [a], out: b}]}\n";
    return t + (use ? "ops: [{use: m0, in: [x], out: [y]}]\n" : "ops: [{op: GELU, in: [x], out: y}]\n");
  };
  // 63 instances inside each other load; 64 are the limit; 20,000 stop at the limit (no stack overflow).
  Program p = load_program_string(chain(63, false, 1), "t.yaml");
  CHECK(p.ops.size() == 1);
  CHECK(p.name(p.outs(p.ops[0])[0]) == "y");
  Loc l;
  CHECK(load_error(chain(64, false, 1), &l).find("nest more than 64 levels deep") != std::string::npos);
  std::string deep = load_error(chain(20000, false, 1), &l);
  CHECK(deep.find("nest more than 64 levels deep") != std::string::npos);
  CHECK(deep.size() < 1000);  // one instance named in the message, not 64 nested ones
  // A cycle through 20,000 modules that no op uses: found without recursion, and the chain is elided.
  std::string cyc = load_error(chain(20000, true, 0), &l);
  CHECK(cyc.find("module 'm0' uses itself (m0 -> m1 -> m2 -> ... (19994 more) -> m19997 -> m19998 -> m19999 -> m0)") != std::string::npos);
  CHECK(l.line == 20003);
  // Two instances whose names meet: module o's own tensor `j.x` is instance j's tensor `x` inside o.
  std::string meet =
      "mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n  n: {in: [a], out: [b], tensors: {x: {shape: [4]}}, ops: [{op: Add, in: [a, x], out: "
      "b}]}\n"
      "  o:\n    in: [a]\n    out: [b]\n    tensors: {j.x: {shape: [4]}}\n    ops: [{use: n, name: j, in: [a], out: [b]}]\nops: [{use: o, in: [x], "
      "out: [y]}]\n";
  CHECK(load_error(meet, &l).find("'o.j.x' (the name 'x' of instance 'o.j' of module n) is also a name of the instance expanded at line 10") !=
        std::string::npos);
  CHECK(l.line == 4);
  // Reading an instance's value from outside (its gradient in grad_sync, a probe) is not a clash.
  CHECK(load_error("mesh: {tp: 2}\ntensors: {x: {shape: [4]}}\nmodules:\n  m: {in: [a], out: [b], ops: [{op: Exp, in: [a], out: h}, "
                   "{op: Add, in: [a, h], out: b}]}\nops: [{use: m, name: i, in: [x], out: [y]}, {op: GELU, in: [i.h], out: i.h}]\n")
            .empty());
}

TEST_CASE("include: each file once, a chain of a thousand files, errors at the program's entry") {
  auto dir = std::filesystem::temp_directory_path() / "spmd_include_chain";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const int n = 1000;
  for (int i = 0; i < n; ++i)
    write("f" + std::to_string(i) + ".yaml", "mesh: {tp: 2}\n" + (i + 1 < n ? "include: f" + std::to_string(i + 1) + ".yaml\n" : std::string()) +
                                                 "modules:\n  m" + std::to_string(i) +
                                                 ": {in: [a], out: [b], ops: [{op: GELU, in: [a], out: b}]}\nops: []\n");
  std::string main = write("main.yaml", "mesh: {tp: 2}\ninclude: f0.yaml\ntensors: {x: {shape: [4]}}\nops: [{use: m999, in: [x], out: [y]}]\n");
  CHECK(load_program_file(main).ops.size() == 1);
  // The last file of the chain has an error: one line names the first two and last three files on the way.
  write("f999.yaml", "mesh: {tp: 2}\nmodules:\n  m999: [\n");
  try {
    load_program_file(main);
    CHECK(false);
  } catch (const LoadError& e) {
    std::string m = e.what();
    CHECK(e.loc.line == 2);
    CHECK(m.find("f0.yaml:2:10: in ") != std::string::npos);
    CHECK(m.find("... (995 more included files): ") != std::string::npos);
    CHECK(m.find("f999.yaml:4:1: invalid YAML") != std::string::npos);
    CHECK(m.size() < 1000);
  }
  // A diamond (a and b both include c) reads c once, so its module is defined once; 2^40 paths are 80 files.
  for (int i = 0; i < 40; ++i) {
    std::string next = i + 1 < 40 ? "include: [a" + std::to_string(i + 1) + ".yaml, b" + std::to_string(i + 1) + ".yaml]\n" : "";
    write("a" + std::to_string(i) + ".yaml", "mesh: {tp: 2}\n" + next + "ops: []\n");
    write("b" + std::to_string(i) + ".yaml",
          "mesh: {tp: 2}\n" + next + (i == 39 ? "modules: {g: {in: [a], out: [b], ops: [{op: GELU, in: [a], out: b}]}}\n" : "") + "ops: []\n");
  }
  CHECK(load_program_file(
            write("diamond.yaml", "mesh: {tp: 2}\ninclude: [a0.yaml, b0.yaml]\ntensors: {x: {shape: [4]}}\nops: [{use: g, in: [x], out: [y]}]\n"))
            .ops.size() == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("inputs that are not regular files, or too big, are located errors") {
  for (const char* path : {"/dev/zero", "/dev/null", "/"}) {
    try {
      load_program_file(path);
      CHECK(false);
    } catch (const LoadError& e) {
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
  }
  auto f = std::filesystem::temp_directory_path() / "spmd_big_input.txt";
  std::ofstream(f) << std::string(2000, 'x');
  CHECK_THROWS_AS(read_input_file(f.string(), 1000), LoadError);
  CHECK(read_input_file(f.string(), 4000).size() == 2000);
  // Standard input (issue 23: it had no limit): read in steps up to the cap; a regular file behind it is checked
  // by its size first, and a device that is not a terminal (`check - < /dev/zero`) is refused before a read.
  std::istringstream big(std::string(200'000, 'x'));
  CHECK_THROWS_WITH_AS(read_input_stream(big, "standard input", -1, 100'000), "standard input has more than the limit of 100000 bytes", LoadError);
  std::istringstream small(std::string(200'000, 'x'));
  CHECK(read_input_stream(small, "standard input", -1, 300'000).size() == 200'000);
  int fd = ::open(f.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::istringstream unread;
  CHECK_THROWS_WITH_AS(read_input_stream(unread, "standard input", fd, 1000), "standard input has 2000 bytes, more than the limit of 1000 bytes",
                       LoadError);
  ::close(fd);
  fd = ::open("/dev/zero", O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK_THROWS_WITH_AS(read_input_stream(unread, "standard input", fd), "standard input is a device, not a program; give a file or a pipe",
                       LoadError);
  ::close(fd);
  std::filesystem::remove(f);
}

TEST_CASE("spec: the single-device model loads from YAML and JSON alike, apart from the plan") {
  std::string yaml =
      "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: R}}\n  w: {shape: [8, 6], placement: {tp: S(1)}}\n"
      "ops:\n  - {op: MatMul, in: [x, w], out: h}\n  - {op: GELU, in: [h], out: y}\noutputs:\n  y: {placement: {tp: S(1)}}\n"
      "spec:\n  ops:\n    - {op: MatMul, in: [x, w], out: h_full}\n    - {op: GELU, in: [h_full], out: y_full}\n"
      "  outputs: {y: y_full}\n  lineage: {h: h_full}\n";
  std::string json =
      "{\"mesh\": {\"tp\": 2}, \"tensors\": {\"x\": {\"shape\": [4, 8], \"placement\": {\"tp\": \"R\"}}, \"w\": {\"shape\": [8, 6], "
      "\"placement\": {\"tp\": \"S(1)\"}}},\n \"ops\": [{\"op\": \"MatMul\", \"in\": [\"x\", \"w\"], \"out\": \"h\"}, {\"op\": \"GELU\", \"in\": [\"h\"], "
      "\"out\": \"y\"}],\n \"outputs\": {\"y\": {\"placement\": {\"tp\": \"S(1)\"}}},\n \"spec\": {\"ops\": [{\"op\": \"MatMul\", \"in\": [\"x\", \"w\"], "
      "\"out\": \"h_full\"}, {\"op\": \"GELU\", \"in\": [\"h_full\"], \"out\": \"y_full\"}],\n  \"outputs\": {\"y\": \"y_full\"}, \"lineage\": {\"h\": \"h_full\"}}}\n";
  Program a = load_program_string(yaml, "a.yaml"), b = load_program_string(json, "b.json");
  CHECK(print_program(a) == print_program(b));
  REQUIRE(a.has_spec);
  CHECK(a.ops.size() == 2);  // the spec ops are apart from the plan's
  REQUIRE(a.spec_ops.size() == 2);
  CHECK(a.name(a.outs(a.spec_ops[1])[0]) == "y_full");
  CHECK(a.spec_ops[0].loc.line == 12);
  REQUIRE(a.spec_outputs.size() == 1);
  CHECK(a.name(a.spec_outputs[0].plan) == "y");
  CHECK(a.name(a.spec_outputs[0].spec) == "y_full");
  REQUIRE(a.lineage.size() == 1);
  CHECK(a.name(a.lineage[0].plan) == "h");
  CHECK(b.spec_ops[0].loc.line == 4);
  // The printer writes the map forms, which load back to the same program.
  CHECK(print_program(load_program_string(print_program(a), "r.yaml")) == print_program(a));
  // The list form and the absent form compare each plan output with the spec tensor of its name.
  std::string base = yaml.substr(0, yaml.find("spec:"));
  Program c = load_program_string(base + "spec:\n  ops:\n    - {op: MatMul, in: [x, w], out: h}\n    - {op: GELU, in: [h], out: y}\n  outputs: [y]\n", "c.yaml");
  Program d = load_program_string(base + "spec:\n  ops:\n    - {op: MatMul, in: [x, w], out: h}\n    - {op: GELU, in: [h], out: y}\n", "d.yaml");
  REQUIRE(c.spec_outputs.size() == 1);
  CHECK(c.spec_outputs[0].plan == c.spec_outputs[0].spec);
  CHECK(print_program(c) == print_program(d));
  // `spec:` before `ops:` (the streaming loader reads it into its small tree first) loads the same program.
  std::string early = "mesh: {tp: 2}\ntensors:\n  x: {shape: [4, 8], placement: {tp: R}}\n  w: {shape: [8, 6], placement: {tp: S(1)}}\n" +
                      yaml.substr(yaml.find("spec:")) + yaml.substr(yaml.find("ops:"), yaml.find("spec:") - yaml.find("ops:"));
  CHECK(print_program(load_program_string(early, "e.yaml")) == print_program(a));
  // The spatial and temporal checks never see the spec: a spec op that would be wrong in the plan is not a finding.
  CHECK(ids(base + "spec:\n  ops:\n    - {op: MatMul, in: [x, w], out: h}\n    - {op: AllReduce, in: [h], out: y, axis: tp}\n").empty());
  // Errors inside the spec are located in both syntaxes.
  Loc l;
  std::string bad_json = json;
  bad_json.replace(bad_json.find("\"lineage\""), 9, "\"lineag\"");
  CHECK(load_error(bad_json, &l).find("unknown key 'lineag' in `spec`; did you mean 'lineage'?") != std::string::npos);
  CHECK(l.line == 5);
  CHECK(load_error(yaml + "  ops2: []\n", &l).find("unknown key 'ops2' in `spec`") != std::string::npos);
  CHECK(l.line == 16);
}

TEST_CASE("spec: modules expand inside the spec, and per-rank plans may carry one") {
  std::string text =
      "mesh: {pp: 2}\ntensors:\n  x: {shape: [4, 8]}\nmodules:\n  m: {in: [a], out: [b], ops: [{op: GELU, in: [a], out: t}, {op: SiLU, in: [t], out: b}]}\n"
      "programs:\n  - ranks: {pp: 0}\n    ops: [{op: GELU, in: [x], out: y}]\n  - ranks: {pp: 1}\n    ops: [{op: GELU, in: [x], out: y}]\n"
      "outputs:\n  y: {}\nspec:\n  ops:\n    - {use: m, in: [x], out: [y]}\n  outputs: [y]\n";
  Program p = load_program_string(text, "t.yaml");
  CHECK(p.per_rank);
  CHECK(p.ops.size() == 2);
  REQUIRE(p.spec_ops.size() == 2);
  CHECK(p.name(p.outs(p.spec_ops[0])[0]) == "m.t");
  CHECK(p.instances.empty());  // instances record ranges of `ops`, not of the spec
  CHECK(print_program(load_program_string(print_program(p), "r.yaml")) == print_program(p));
}
