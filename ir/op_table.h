// ir/op_table.h - the op table of ir/ops.def as data: kinds, names, arities and attribute specs.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spmd {

enum class OpKind : std::uint8_t {
#define OP(Name, Cat, MinIn, MaxIn, MinOut, MaxOut, Attrs, Operands, Meaning) Name,
#include "ir/ops.def"
#undef OP
};

enum class OpCategory : std::uint8_t { compute, gradient, collective, p2p, async, precision, shape, spmd, optimizer, later };

enum class AttrType : std::uint8_t { Axes, Int, Ints, Number, Bool, Placement, Placements, Reduce, DType, Shape, Name, Names, Coords, Enum, Size };

struct AttrSpec {
  std::string name;
  AttrType type;
  bool required = false;
  std::vector<std::string> choices;  // Enum
};

struct OpInfo {
  OpKind kind;
  std::string_view name;
  OpCategory category;
  int min_in, max_in, min_out, max_out;
  std::string_view attrs_text;
  std::string_view operands;
  std::string_view meaning;
  std::vector<AttrSpec> attrs;  // parsed from attrs_text, plus `stream`
  const AttrSpec* find_attr(std::string_view n) const;
};

inline constexpr int kOpCount = 0
#define OP(Name, Cat, MinIn, MaxIn, MinOut, MaxOut, Attrs, Operands, Meaning) +1
#include "ir/ops.def"
#undef OP
    ;

const OpInfo& op_info(OpKind k);
std::span<const OpInfo> all_ops();
std::optional<OpKind> op_by_name(std::string_view name);
std::string_view op_name(OpKind k);
std::string_view category_name(OpCategory c);
std::string attr_type_name(const AttrSpec& a);

// Check IDs (ir/checks.def).
enum class CheckId : std::uint8_t {
#define CHECK_ID(Enum, Id, Phase, Meaning) Enum,
#include "ir/checks.def"
#undef CHECK_ID
};
std::string_view check_name(CheckId id);
std::optional<CheckId> check_by_name(std::string_view name);
std::vector<std::string_view> all_check_names();

// The closest candidate to `word` by edit distance, if close enough to be a likely typo.
std::optional<std::string> did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// The op table as Markdown (docs/ops.md) or as plain text (`spmdcheck ops`).
std::string ops_markdown();
std::string ops_text();

}  // namespace spmd
