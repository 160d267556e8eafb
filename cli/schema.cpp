// cli/schema.cpp - the JSON Schema of the program format, generated from the op table.
#include "cli/schema.h"

#include "ir/op_table.h"
#include "ir/program.h"
#include "schedules/schedule.h"

namespace spmd {

namespace {

using nlohmann::json;

// A YAML scalar that names something (a tensor, a handle, a stream): YAML may read `1` as a number.
json name_schema() { return {{"type", json::array({"string", "number"})}, {"minLength", 1}}; }
json names_schema() { return {{"anyOf", json::array({name_schema(), {{"type", "array"}, {"items", name_schema()}}})}}; }
// A size: a positive integer or an expression over named sizes ("4*H", "S/cp").
json size_schema(std::int64_t max = kMaxSize) {
  return {{"anyOf", json::array({{{"type", "integer"}, {"minimum", 1}, {"maximum", max}}, {{"type", "string"}, {"minLength", 1}}})}};
}
json shape_schema() { return {{"type", "array"}, {"maxItems", kMaxRank}, {"items", size_schema()}}; }

// The placement spellings of ir/placement.cpp parse_placement (including DTensor's).
json placement_schema() {
  return {{"type", "string"},
          {"pattern",
           R"(^\s*((R|Replicate|I|Invariant|V|Varying)(\s*\(\s*\))?|(P|Partial)(\s*\(\s*(sum|avg|mean|max|min)?\s*\))?|(S|Shard)\s*\(\s*-?[0-9]+\s*\))\s*$)"},
          {"description", "R, I, V, P, P(sum|avg|max|min) or S(d); also Replicate(), Shard(d), Partial()"}};
}
// {axis: placement}, a list in mesh order, or one placement on a one-axis mesh.
json placements_schema() {
  return {{"anyOf", json::array({{{"type", "object"},
                                  {"properties", {{"order", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},  // shard order (docs/format.md)
                                  {"additionalProperties", placement_schema()}},
                                 {{"type", "array"}, {"items", placement_schema()}},
                                 placement_schema()})}};
}
json coords_schema() { return {{"type", "object"}, {"additionalProperties", {{"type", "integer"}, {"minimum", 0}}}}; }
json bool_schema() {
  return {{"anyOf", json::array({{{"type", "boolean"}}, {{"enum", json::array({"true", "false", "True", "False", "yes", "no"})}}})}};
}
// The dtype names, then the aliases the loader also takes (kept only while parse_dtype accepts them;
// a new alias missing here makes the schema test fail on the example that uses it).
json dtype_schema() {
  json names = dtype_names();
  for (const char* alias : {"float32", "fp32", "float64", "bfloat16", "float16", "fp16", "int64", "int32", "int8", "fp8"}) {
    DType d;
    if (parse_dtype(alias, d)) names.push_back(alias);
  }
  return {{"enum", names}};
}

json attr_schema(const AttrSpec& a) {
  switch (a.type) {
    case AttrType::Axes:
    {
      json one = {{"type", json::array({"string", "number"})}};  // an axis the mesh lacks is a finding (illegal-collective), not bad input
      json list = {{"type", "array"}, {"minItems", 1}, {"items", one}};
      return {{"anyOf", json::array({one, list})}, {"description", "a mesh axis name or a list of them"}};
    }
    case AttrType::Int:  // ranges as the loader's
      if (a.name == "src" || a.name == "dst") return {{"type", "integer"}, {"minimum", 0}, {"maximum", 1 << 20}};
      return {{"type", "integer"}, {"minimum", -kMaxRank}, {"maximum", kMaxRank - 1}};
    case AttrType::Ints:
    {
      json one = {{"type", "integer"}, {"minimum", -kMaxRank}, {"maximum", kMaxRank - 1}};
      json list = {{"type", "array"}, {"minItems", 1}, {"maxItems", kMaxRank}, {"items", one}};
      return {{"anyOf", json::array({one, list})}};
    }
    case AttrType::Number:  // a number, or a scale expression over sizes and mesh axes such as 1/dp or 1/(dp*cp)
      return {{"type", json::array({"number", "string"})}};
    case AttrType::Bool: return bool_schema();
    case AttrType::Placement: return placement_schema();
    case AttrType::Placements: return placements_schema();
    case AttrType::Reduce: return {{"enum", json::array({"sum", "avg", "mean", "max", "min"})}};
    case AttrType::DType: return dtype_schema();
    case AttrType::Shape:
      if (a.name == "split_sizes")  // AllToAll: one size per rank of the group, 0 allowed
        return {{"type", "array"}, {"minItems", 1}, {"maxItems", 4096},
                {"items", {{"anyOf", json::array({{{"type", "integer"}, {"minimum", 0}, {"maximum", kMaxSize}}, {{"type", "string"}, {"minLength", 1}}})}}}};
      return shape_schema();
    case AttrType::Name: return name_schema();
    case AttrType::Names: return names_schema();
    case AttrType::Coords: return coords_schema();
    case AttrType::Enum: return {{"enum", a.choices}};
    case AttrType::Size:  // an offset or a length: 0 allowed
      return {{"anyOf", json::array({{{"type", "integer"}, {"minimum", 0}, {"maximum", kMaxSize}}, {{"type", "string"}, {"minLength", 1}}})}};
  }
  return json::object();
}

// One op item: `op`, `in`, `out` and, per op (if/then), exactly the attributes of its row in ops.def.
json op_item_schema() {
  json names = json::array();
  json per_op = json::array();
  for (const OpInfo& info : all_ops()) {
    if (info.category == OpCategory::later) continue;  // reserved: a located error in the loader
    names.push_back(std::string(info.name));
    // `in` and `out`: a list of names with the op's arity, or one name where one is allowed.
    auto arity = [](int lo, int hi) {
      json list = {{"type", "array"}, {"minItems", lo}, {"maxItems", hi}, {"items", name_schema()}};
      if (lo > 1 || hi < 1) return list;
      return json{{"anyOf", json::array({name_schema(), list})}};
    };
    json props = {{"op", json::object()}, {"in", arity(info.min_in, info.max_in)}, {"out", arity(info.min_out, info.max_out)}};
    json required = json::array({"op"});
    for (const AttrSpec& a : info.attrs) {
      props[a.name] = attr_schema(a);
      if (a.required) required.push_back(a.name);
    }
    json then = {{"properties", props}, {"required", required}, {"additionalProperties", false}};
    if (info.min_in > 0) then["required"].push_back("in");
    if (info.min_out > 0) then["required"].push_back("out");
    per_op.push_back({{"if", {{"properties", {{"op", {{"const", std::string(info.name)}}}}}, {"required", json::array({"op"})}}}, {"then", then}});
  }
  return {{"type", "object"},
          {"description", "an op: {op: Name, in: [...], out: ..., attributes} (spmdcheck ops lists them)"},
          {"required", json::array({"op"})},
          {"properties", {{"op", {{"enum", names}}}, {"in", names_schema()}, {"out", names_schema()}}},
          {"allOf", per_op}};
}

// An op-list item that expands a module: {use: M, in, out, name, with, repeat} (docs/format.md, Modules).
json use_item_schema() {
  return {{"type", "object"},
          {"description", "a module instance: {use: M, in: [...], out: [...], name, with: {param: value}, repeat: N}"},
          {"additionalProperties", false},
          {"required", json::array({"use", "in", "out"})},
          {"properties",
           {{"use", {{"type", "string"}, {"minLength", 1}}},
            {"in", names_schema()},
            {"out", names_schema()},
            {"name", {{"type", "string"}, {"minLength", 1}}},
            {"with", {{"type", "object"}, {"additionalProperties", size_schema()}}},
            {"repeat", {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000000}}}}}};
}

json op_list_schema() {
  return {{"type", "array"}, {"items", {{"anyOf", json::array({{{"$ref", "#/definitions/op"}}, {{"$ref", "#/definitions/use"}}})}}}};
}

}  // namespace

json program_schema() {
  json ids = json::array();
  for (auto id : all_check_names()) ids.push_back(std::string(id));
  json symbolic = {{"type", "object"},
                   {"additionalProperties", false},
                   {"properties",
                    {{"min", {{"type", "integer"}, {"minimum", 1}}},
                     {"max", {{"type", "integer"}, {"minimum", 1}}},
                     {"multiple_of", {{"type", "integer"}, {"minimum", 1}}},
                     {"in", {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "integer"}, {"minimum", 1}}}}}}}};
  json tensor = {{"type", "object"},
                 {"additionalProperties", false},
                 {"required", json::array({"shape"})},
                 {"properties",
                  {{"shape", shape_schema()}, {"placement", {{"anyOf", json::array({placements_schema(), {{"type", "null"}}})}}},
                   {"dtype", dtype_schema()}, {"param", bool_schema()}, {"uneven", bool_schema()}}}};
  json output = {{"anyOf", json::array({{{"type", "null"}},
                                        {{"type", "object"},
                                         {"additionalProperties", false},
                                         {"properties", {{"placement", placements_schema()}, {"shape", shape_schema()}, {"ranks", coords_schema()}}}}})}};
  json schedule = {{"type", "object"},
                   {"additionalProperties", false},
                   {"properties",
                    {{"kind", {{"enum", schedule_kinds()}}},
                     {"csv", {{"type", "string"}}},
                     {"axis", {{"type", "string"}}},
                     {"microbatches", {{"type", "integer"}, {"minimum", 1}}},
                     {"virtual_stages", {{"type", "integer"}, {"minimum", 1}}},
                     // stages that run real ops (docs/schedules.md, "Stages")
                     {"stages", {{"type", "array"},
                                 {"minItems", 1},
                                 {"items", {{"anyOf", json::array({{{"$ref", "#/definitions/use"}},
                                                                   {{"type", "object"},
                                                                    {"additionalProperties", false},
                                                                    {"required", json::array({"out", "ops"})},
                                                                    {"properties", {{"in", names_schema()}, {"out", names_schema()}, {"ops", op_list_schema()}}}}})}}}}},
                     {"batch", {{"type", "object"},
                                {"additionalProperties",
                                 {{"anyOf", json::array({{{"type", "integer"}},
                                                         {{"type", "object"},
                                                          {"additionalProperties", false},
                                                          {"required", json::array({"dim"})},
                                                          {"properties", {{"dim", {{"type", "integer"}}},
                                                                          {"order", {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}}}}}}})}}}}},
                     {"merge", {{"type", "object"}, {"additionalProperties", {{"anyOf", json::array({{{"enum", json::array({"sum", "mean"})}}, {{"type", "integer"}}})}}}}},
                     {"steps", {{"type", "integer"}, {"minimum", 1}}},
                     {"scale_grads", bool_schema()}}}};
  json rank_program = {{"type", "object"},
                       {"additionalProperties", false},
                       {"required", json::array({"ranks", "ops"})},
                       {"properties", {{"ranks", coords_schema()}, {"ops", op_list_schema()}}}};
  // `spec:` (docs/format.md, "Equivalence"): the single-device model, the outputs compared and the lineage.
  json name_map = {{"type", "object"}, {"additionalProperties", name_schema()}};
  json spec = {{"type", "object"},
               {"additionalProperties", false},
               {"properties",
                {{"ops", {{"anyOf", json::array({op_list_schema(), {{"type", "null"}}})}}},
                 {"outputs", {{"anyOf", json::array({{{"type", "array"}, {"items", name_schema()}}, name_map, {{"type", "null"}}})}}},
                 {"lineage", {{"anyOf", json::array({name_map, {{"type", "null"}}})}}},
                 {"optimizer", {{"anyOf", json::array({op_list_schema(), {{"type", "null"}}})}}}}}};
  json module = {{"type", "object"},
                 {"additionalProperties", false},
                 {"required", json::array({"ops"})},
                 {"properties",
                  {{"description", {{"type", "string"}}},
                   {"params", {{"type", "array"}, {"items", {{"type", "string"}, {"minLength", 1}}}}},
                   {"in", names_schema()},
                   {"out", names_schema()},
                   {"tensors", {{"type", json::array({"object", "null"})}, {"additionalProperties", tensor}}},
                   {"ops", op_list_schema()}}}};
  return {
      {"$schema", "http://json-schema.org/draft-07/schema#"},
      {"$id", "https://spmdcheck.invalid/program.schema.json"},
      {"title", "spmdcheck program"},
      {"description", "A distributed training program for spmdcheck (docs/format.md). Generated by `spmdcheck schema` from the op table."},
      {"type", "object"},
      {"additionalProperties", false},
      {"required", json::array({"mesh"})},
      {"oneOf", json::array({{{"required", json::array({"ops"})}}, {{"required", json::array({"programs"})}}, {{"required", json::array({"schedule"})}}})},
      {"definitions", {{"op", op_item_schema()}, {"use", use_item_schema()}}},
      {"properties",
       {{"name", {{"type", "string"}}},
        {"description", {{"type", "string"}}},
        {"mesh", {{"type", "object"}, {"minProperties", 1}, {"maxProperties", kMaxAxes}, {"additionalProperties", size_schema(1 << 20)}}},
        {"sizes", {{"type", json::array({"object", "null"})}, {"propertyNames", {{"pattern", "^[A-Za-z_]"}}}, {"additionalProperties", {{"anyOf", json::array({size_schema(), symbolic})}}}}},
        {"tensors", {{"type", json::array({"object", "null"})}, {"additionalProperties", tensor}}},
        {"include", {{"anyOf", json::array({{{"type", "string"}, {"minLength", 1}}, {{"type", "array"}, {"items", {{"type", "string"}, {"minLength", 1}}}}})}}},
        {"modules", {{"type", json::array({"object", "null"})}, {"additionalProperties", module}}},
        {"ops", op_list_schema()},
        {"programs", {{"type", "array"}, {"minItems", 1}, {"items", rank_program}}},
        {"schedule", schedule},
        {"p2p_model", {{"enum", json::array({"eager", "rendezvous"})}}},
        {"view", {{"enum", json::array({"local", "global"})}, {"description", "local: ops compute on each rank's local pieces (shard_map / Megatron style; docs/format.md, Local view)"}}},
        {"outputs", {{"type", json::array({"object", "null"})}, {"additionalProperties", output}}},
        {"expect", {{"anyOf", json::array({{{"type", "null"}}, {{"type", "array"}, {"items", {{"enum", ids}}}}})}}},
        {"loss", name_schema()},
        {"train", bool_schema()},
        {"backward", op_list_schema()},
        {"grad_sync", op_list_schema()},
        {"optimizer", op_list_schema()},
        {"spec", spec}}}};
}

}  // namespace spmd
