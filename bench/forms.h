// bench/forms.h - the printer's YAML (block at the top, one flow mapping per op) rewritten as the other forms a
// generator writes: JSON (what `json.dump` gives) and block style (one key per line, as a person writes).
// Only the shapes print_program produces are handled (top-level keys with a flow value, a block mapping of
// flow values, or a block list of flow mappings).
#pragma once
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace spmd::bench {

// A flow value ({a: [1, b]}) as JSON: plain scalars become numbers, booleans or strings.
inline void flow_to_json(std::string_view s, std::string& out) {
  auto scalar = [&](std::string_view t) {
    while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    bool num = !t.empty() && (t.size() == 1 || t[0] != '0');
    for (std::size_t i = 0; i < t.size(); ++i) num &= std::isdigit(static_cast<unsigned char>(t[i])) || (i == 0 && t[i] == '-' && t.size() > 1);
    if (num || t == "true" || t == "false") {
      out += t;
      return;
    }
    out += '"';
    for (char c : t) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  };
  std::size_t i = 0, start = std::string::npos;
  auto flush = [&] {
    if (start != std::string::npos) scalar(s.substr(start, i - start)), start = std::string::npos;
  };
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '{' || c == '}' || c == '[' || c == ']' || c == ',') {
      flush();
      out += c;
    } else if (c == ':' && (i + 1 == s.size() || s[i + 1] == ' ')) {
      flush();
      out += ':';
    } else if (c != ' ' && start == std::string::npos) {
      start = i;
    }
  }
  flush();
}

// The printer's text as one JSON object, one op per line.
inline std::string yaml_to_json(const std::string& yaml) {
  std::string out = "{";
  std::vector<std::string_view> lines;
  for (std::size_t b = 0; b < yaml.size();) {
    std::size_t e = yaml.find('\n', b);
    if (e == std::string::npos) e = yaml.size();
    lines.emplace_back(yaml.data() + b, e - b);
    b = e + 1;
  }
  bool first_key = true;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (l.empty()) continue;
    std::size_t colon = l.find(':');
    std::string_view key = l.substr(0, colon), rest = l.substr(colon + 1);
    out += first_key ? "\n\"" : ",\n\"";
    first_key = false;
    out += std::string(key) + "\": ";
    if (!rest.empty() && rest != " ") {
      flow_to_json(rest, out);
      continue;
    }
    bool list = i + 1 < lines.size() && lines[i + 1].substr(0, 4) == "  - ";
    out += list ? "[" : "{";
    bool first = true;
    for (; i + 1 < lines.size() && lines[i + 1].substr(0, 2) == "  "; ++i) {
      std::string_view c = lines[i + 1].substr(2);
      out += first ? "\n  " : ",\n  ";
      first = false;
      if (list) {
        flow_to_json(c.substr(2), out);
      } else {
        std::size_t k = c.find(':');
        out += "\"" + std::string(c.substr(0, k)) + "\": ";
        flow_to_json(c.substr(k + 1), out);
      }
    }
    out += list ? "\n]" : "\n}";
  }
  return out + "\n}\n";
}

// The printer's text with every op written in block style: `- op: MatMul` then one key per line.
inline std::string yaml_to_block(const std::string& yaml) {
  std::string out;
  for (std::size_t b = 0; b < yaml.size();) {
    std::size_t e = yaml.find('\n', b);
    if (e == std::string::npos) e = yaml.size();
    std::string_view l(yaml.data() + b, e - b);
    b = e + 1;
    if (l.substr(0, 5) != "  - {") {
      out.append(l);
      out += '\n';
      continue;
    }
    std::string_view body = l.substr(5, l.size() - 6);  // inside { }
    int depth = 0;
    std::size_t start = 0;
    bool first = true;
    for (std::size_t i = 0; i <= body.size(); ++i) {
      char c = i < body.size() ? body[i] : ',';
      if (c == '[' || c == '{') ++depth;
      if (c == ']' || c == '}') --depth;
      if (c == ',' && depth == 0) {
        std::string_view kv = body.substr(start, i - start);
        while (!kv.empty() && kv.front() == ' ') kv.remove_prefix(1);
        out += first ? "  - " : "    ";
        out.append(kv);
        out += '\n';
        first = false;
        start = i + 1;
      }
    }
  }
  return out;
}

}  // namespace spmd::bench
