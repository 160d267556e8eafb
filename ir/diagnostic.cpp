// ir/diagnostic.cpp - ordering and capping of diagnostics; input text made safe to print.
#include "ir/diagnostic.h"

#include <algorithm>
#include <tuple>

namespace spmd {

const char* fix_kind_name(FixKind k) {
  switch (k) {
    case FixKind::None: return "none";
    case FixKind::InsertBefore: return "insert_before";
    case FixKind::InsertAfter: return "insert_after";
    case FixKind::Replace: return "replace";
    case FixKind::Append: return "append";
    case FixKind::Move: return "move";
  }
  return "none";
}

std::string printable(std::string_view s, std::size_t max) {
  auto plain = [](unsigned char c) { return c >= 0x20 && c != 0x7f; };
  if (s.size() <= max && std::all_of(s.begin(), s.end(), [&](char c) { return plain(static_cast<unsigned char>(c)); })) return std::string(s);
  std::string out;
  std::size_t i = 0;
  for (; i < s.size() && out.size() < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (plain(c)) {
      out += static_cast<char>(c);
      continue;
    }
    static const char hex[] = "0123456789abcdef";
    switch (c) {
      case 0:
        out += "\\0";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    }
  }
  if (i < s.size()) {
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i, out.pop_back();  // a whole character
    out += "... (" + std::to_string(s.size() - i) + " more bytes)";
  }
  return out;
}

std::string bounded_message(std::string_view msg) {
  constexpr std::size_t head = 3072, tail = 1024;
  if (msg.size() <= head + tail) return printable(msg);
  auto boundary = [&](std::size_t i) {  // back to the start of a UTF-8 character
    while (i > 0 && (static_cast<unsigned char>(msg[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  std::size_t a = boundary(head), b = boundary(msg.size() - tail);
  return printable(msg.substr(0, a)) + " ... (" + std::to_string(b - a) + " bytes left out) ... " + printable(msg.substr(b));
}

std::size_t sort_and_cap(std::vector<Diagnostic>& diags, std::size_t cap) {
  std::stable_sort(diags.begin(), diags.end(), [](const Diagnostic& a, const Diagnostic& b) {
    return std::tie(a.loc.line, a.loc.col) < std::tie(b.loc.line, b.loc.col);
  });
  if (diags.size() <= cap) return 0;
  std::size_t dropped = diags.size() - cap;
  diags.resize(cap);
  return dropped;
}

}  // namespace spmd
