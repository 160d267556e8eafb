// cli/schema.h - `spmdcheck schema`: a JSON Schema (draft-07) of the program format.
//
// Ops, their attributes and attribute types come from the op table (ir/ops.def), check IDs from
// ir/checks.def and dtypes from the IR, so the schema cannot drift from the loader. It describes the
// shape of a file (keys, value types, op names, required attributes); what needs the program's own
// names (mesh axes, declared sizes, defined tensors) is left to the loader.
#pragma once
#include <nlohmann/json.hpp>

namespace spmd {

nlohmann::json program_schema();

}  // namespace spmd
