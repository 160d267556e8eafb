// cli/render.h - diagnostics as compiler-style text and as the contract's JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ir/diagnostic.h"

namespace spmd {

std::string render_text(const std::string& file, const std::vector<Diagnostic>& diags);
std::string render_load_error(const std::string& file, const LoadError& e);
nlohmann::json render_json(const std::string& file, const std::vector<Diagnostic>& diags);

}  // namespace spmd
