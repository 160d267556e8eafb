// ir/doc.cpp - libyaml and JSON event sources, the compact Doc, and located YAML syntax errors.
#include "ir/doc.h"

#include <yaml.h>

#include <algorithm>
#include <cstring>

namespace spmd {

namespace {

// ---- YAML syntax errors, said plainly ---------------------------------------------------------

std::uint32_t indent_of(std::string_view line) {
  std::uint32_t n = 0;
  while (n < line.size() && line[n] == ' ') ++n;
  return n;
}

std::vector<std::string_view> split_lines(const std::string& text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.emplace_back(text.data() + start, end - start);
    start = end + 1;
  }
  return lines;
}

bool content_line(std::string_view l) {
  std::uint32_t i = indent_of(l);
  return i < l.size() && l[i] != '#' && l[i] != '\r';
}

// YAML forbids tabs in indentation; parsers report them only as a vague "cannot start any token".
void reject_tab_indentation(const std::string& text) {
  std::uint32_t line = 1;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    for (std::size_t i = start; i < end && (text[i] == ' ' || text[i] == '\t'); ++i)
      if (text[i] == '\t')
        throw LoadError({line, static_cast<std::uint32_t>(i - start + 1)}, "invalid YAML: a tab in indentation (YAML indents with spaces)");
    start = end + 1;
    ++line;
  }
}

// A line whose indentation matches no open block: name it and say which indentations would fit.
std::string indentation_message(const std::string& text, std::uint32_t bad_line) {
  auto lines = split_lines(text);
  if (bad_line == 0 || bad_line > lines.size() || !content_line(lines[bad_line - 1])) return "";
  std::uint32_t have = indent_of(lines[bad_line - 1]);
  // The open blocks before the bad line: (indent, line), innermost last.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> open;
  bool in_flow = false;
  for (std::uint32_t i = 1; i < bad_line; ++i) {
    std::string_view l = lines[i - 1];
    if (!content_line(l) || in_flow) {
      if (in_flow && l.find_first_of("]}") != std::string_view::npos) in_flow = false;
      continue;
    }
    std::uint32_t ind = indent_of(l);
    while (!open.empty() && open.back().first > ind) open.pop_back();
    if (open.empty() || open.back().first < ind) open.emplace_back(ind, i);
    else open.back().second = i;
  }
  if (open.empty()) return "";
  for (const auto& [ind, line] : open)
    if (ind == have) return "";  // the indentation fits a block: something else is wrong
  const auto& [want, sib] = open.back();
  std::string msg = "invalid YAML: line " + std::to_string(bad_line) + " is indented by " + std::to_string(have) + " spaces, ";
  if (have > want)
    msg += "deeper than line " + std::to_string(sib) + " before it (" + std::to_string(want) + " spaces), which does not open a block";
  else
    msg += "which matches no enclosing block";
  msg += ": expected " + std::to_string(want) + " spaces here to continue the block of line " + std::to_string(sib);
  if (open.size() > 1) {
    msg += " (or";
    for (std::size_t i = open.size() - 1; i-- > 0;) msg += " " + std::to_string(open[i].first) + (i ? "," : "");
    msg += " to close it)";
  }
  return msg;
}

[[noreturn]] void yaml_syntax_error(const std::string& text, const yaml_parser_t& p) {
  reject_tab_indentation(text);  // the likely cause, said plainly
  Loc at{static_cast<std::uint32_t>(p.problem_mark.line + 1), static_cast<std::uint32_t>(p.problem_mark.column + 1)};
  if (p.error == YAML_READER_ERROR) {
    // Encoding errors carry a byte offset, not a mark: locate the offending byte.
    std::size_t off = std::min(p.problem_offset, text.size());
    std::size_t line_start = text.rfind('\n', off ? off - 1 : 0);
    line_start = (line_start == std::string::npos || off == 0) ? 0 : line_start + 1;
    at = {static_cast<std::uint32_t>(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(line_start), '\n')),
          static_cast<std::uint32_t>(off - line_start + 1)};
    throw LoadError(at, std::string("invalid YAML: ") + (p.problem ? p.problem : "bad encoding") + " (a program file must be UTF-8)");
  }
  Loc ctx{static_cast<std::uint32_t>(p.context_mark.line + 1), static_cast<std::uint32_t>(p.context_mark.column + 1)};
  std::string problem = p.problem ? p.problem : "syntax error";
  std::string context = p.context ? p.context : "";
  if (context == "while scanning a quoted scalar" && problem.find("end of stream") != std::string::npos)
    throw LoadError(ctx, "invalid YAML: the quoted string that starts here is never closed (it swallows the rest of the file)");
  std::size_t off = p.problem_mark.index;
  if (off < text.size() && text[off] == ',' && context.find("block") != std::string::npos)
    throw LoadError(at, "invalid YAML: text that is not a YAML node here (such as a ',' outside [ ] or { })");
  if (context.find("block") != std::string::npos) {
    std::string m = indentation_message(text, at.line);
    if (!m.empty()) throw LoadError(at, m);
  }
  std::string msg = "invalid YAML: " + problem;
  if (!context.empty()) msg += " (" + context + " that starts at line " + std::to_string(ctx.line) + ", column " + std::to_string(ctx.col) + ")";
  throw LoadError(at, msg);
}

// ---- libyaml ---------------------------------------------------------------------------------

class YamlSource final : public EventSource {
 public:
  explicit YamlSource(const std::string& text) : text_(text) {
    yaml_parser_initialize(&p_);
    yaml_parser_set_input_string(&p_, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  }
  ~YamlSource() override {
    if (have_) yaml_event_delete(&ev_);
    yaml_parser_delete(&p_);
  }
  void next(Event& e) override {
    for (;;) {
      if (have_) yaml_event_delete(&ev_), have_ = false;
      if (done_) {
        e.type = EvType::StreamEnd;
        return;
      }
      if (!yaml_parser_parse(&p_, &ev_)) yaml_syntax_error(text_, p_);
      have_ = true;
      e.loc = {static_cast<std::uint32_t>(ev_.start_mark.line + 1), static_cast<std::uint32_t>(ev_.start_mark.column + 1)};
      e.quoted = false;
      switch (ev_.type) {
        case YAML_NO_EVENT:
        case YAML_STREAM_START_EVENT: continue;
        case YAML_STREAM_END_EVENT: done_ = true, e.type = EvType::StreamEnd; return;
        case YAML_DOCUMENT_START_EVENT:
          e.type = EvType::DocStart;
          e.implicit = ev_.data.document_start.implicit != 0;
          return;
        case YAML_DOCUMENT_END_EVENT: e.type = EvType::DocEnd; return;
        case YAML_ALIAS_EVENT: e.type = EvType::Alias; return;
        case YAML_SCALAR_EVENT:
          e.type = EvType::Scalar;
          e.text = {reinterpret_cast<const char*>(ev_.data.scalar.value), ev_.data.scalar.length};
          e.quoted = ev_.data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
          return;
        case YAML_SEQUENCE_START_EVENT: e.type = EvType::SeqStart; return;
        case YAML_SEQUENCE_END_EVENT: e.type = EvType::SeqEnd; return;
        case YAML_MAPPING_START_EVENT: e.type = EvType::MapStart; return;
        case YAML_MAPPING_END_EVENT: e.type = EvType::MapEnd; return;
      }
    }
  }

 private:
  const std::string& text_;
  yaml_parser_t p_;
  yaml_event_t ev_;
  bool have_ = false, done_ = false;
};

// ---- JSON ------------------------------------------------------------------------------------

class JsonSource final : public EventSource {
 public:
  explicit JsonSource(const std::string& text) : s_(text.data()), p_(text.data()), end_(text.data() + text.size()), line_start_(text.data()) {}

  bool raw_item(RawJson& r) override {
    if (stack_.empty()) return false;
    Level& l = stack_.back();
    if (l.obj && l.st == 2) return false;
    r = {p_, end_, line_start_, line_};
    auto ws = [&] {
      while (r.p < r.end) {
        char c = *r.p;
        if (c == '\n') ++r.line, r.line_start = ++r.p;
        else if (c == ' ' || c == '\t' || c == '\r') ++r.p;
        else break;
      }
    };
    ws();
    if (l.st == 1) {
      if (r.p >= r.end || *r.p != ',') return false;
      ++r.p;
      ws();
    }
    return r.p < r.end && *r.p == (l.obj ? '"' : '{');
  }

  void raw_commit(const RawJson& r) override {
    p_ = r.p;
    line_start_ = r.line_start;
    line_ = r.line;
    stack_.back().st = 1;
  }

  void next(Event& e) override {
    e.quoted = false;
    if (!doc_started_) {
      doc_started_ = true;
      ws();
      e.type = EvType::DocStart;
      e.implicit = true;
      e.loc = here();
      return;
    }
    if (state_ == 2) {
      e.type = EvType::StreamEnd;
      return;
    }
    ws();
    e.loc = here();
    if (stack_.empty()) {
      if (!root_started_) {
        root_started_ = true;
        value(e);
        return;
      }
      if (p_ != end_) throw NotJson{};
      state_ = 2;
      e.type = EvType::DocEnd;
      return;
    }
    Level& l = stack_.back();
    if (!l.obj) {
      if (p_ < end_ && *p_ == ']' && l.st != 2) return close(e, EvType::SeqEnd);
      if (l.st == 1) {
        if (p_ >= end_ || *p_ != ',') throw NotJson{};
        ++p_;
        ws();
        e.loc = here();
      }
      l.st = 1;
      return value(e);
    }
    if (l.st == 2) {
      l.st = 1;
      return value(e);
    }
    if (p_ < end_ && *p_ == '}') return close(e, EvType::MapEnd);
    if (l.st == 1) {
      if (p_ >= end_ || *p_ != ',') throw NotJson{};
      ++p_;
      ws();
      e.loc = here();
    }
    if (p_ >= end_ || *p_ != '"') throw NotJson{};
    string(e);
    ws();
    if (p_ >= end_ || *p_ != ':') throw NotJson{};
    ++p_;
    l.st = 2;
  }

 private:
  struct Level {
    bool obj;
    std::uint8_t st;  // 0 just opened, 1 after an item, 2 (object) after a key and ':'
  };

  Loc here() const { return {line_, static_cast<std::uint32_t>(p_ - line_start_ + 1)}; }

  void ws() {
    while (p_ < end_) {
      char c = *p_;
      if (c == '\n') {
        ++line_;
        line_start_ = ++p_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++p_;
      } else {
        break;
      }
    }
  }

  void close(Event& e, EvType t) {
    ++p_;
    stack_.pop_back();
    e.type = t;
  }

  void value(Event& e) {
    if (p_ >= end_) throw NotJson{};
    char c = *p_;
    if (c == '{' || c == '[') {
      ++p_;
      stack_.push_back({c == '{', 0});
      e.type = c == '{' ? EvType::MapStart : EvType::SeqStart;
      return;
    }
    if (c == '"') return string(e);
    const char* b = p_;
    if (c == '-' || (c >= '0' && c <= '9')) {
      if (*p_ == '-') ++p_;
      if (p_ < end_ && *p_ == '0') ++p_;
      else if (p_ < end_ && *p_ >= '1' && *p_ <= '9') while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      else throw NotJson{};
      if (p_ < end_ && *p_ == '.') {
        ++p_;
        if (p_ >= end_ || *p_ < '0' || *p_ > '9') throw NotJson{};
        while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      }
      if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
        ++p_;
        if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
        if (p_ >= end_ || *p_ < '0' || *p_ > '9') throw NotJson{};
        while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      }
    } else {
      for (const char* lit : {"true", "false", "null"}) {
        std::size_t n = std::strlen(lit);
        if (static_cast<std::size_t>(end_ - p_) >= n && std::memcmp(p_, lit, n) == 0) {
          p_ += n;
          break;
        }
      }
      if (p_ == b) throw NotJson{};
    }
    if (p_ < end_ && !std::strchr(" \t\r\n,]}", *p_)) throw NotJson{};
    e.type = EvType::Scalar;
    e.text = {b, static_cast<std::size_t>(p_ - b)};
  }

  void string(Event& e) {
    ++p_;
    const char* b = p_;
    while (p_ < end_ && *p_ != '"' && *p_ != '\\') {
      if (static_cast<unsigned char>(*p_) < 0x20) throw NotJson{};
      ++p_;
    }
    if (p_ >= end_) throw NotJson{};
    e.type = EvType::Scalar;
    e.quoted = true;
    if (*p_ == '"') {
      e.text = {b, static_cast<std::size_t>(p_ - b)};
      ++p_;
      return;
    }
    buf_.assign(b, p_);
    while (p_ < end_ && *p_ != '"') {
      char c = *p_++;
      if (static_cast<unsigned char>(c) < 0x20) throw NotJson{};
      if (c != '\\') {
        buf_ += c;
        continue;
      }
      if (p_ >= end_) throw NotJson{};
      c = *p_++;
      switch (c) {
        case '"': case '\\': case '/': buf_ += c; break;
        case 'b': buf_ += '\b'; break;
        case 'f': buf_ += '\f'; break;
        case 'n': buf_ += '\n'; break;
        case 'r': buf_ += '\r'; break;
        case 't': buf_ += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') throw NotJson{};
            p_ += 2;
            std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) throw NotJson{};
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(cp);
          break;
        }
        default: throw NotJson{};
      }
    }
    if (p_ >= end_) throw NotJson{};
    ++p_;
    e.text = buf_;
  }

  std::uint32_t hex4() {
    if (end_ - p_ < 4) throw NotJson{};
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = *p_++;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else throw NotJson{};
    }
    return v;
  }

  void utf8(std::uint32_t cp) {
    if (cp < 0x80) buf_ += static_cast<char>(cp);
    else if (cp < 0x800) buf_ += static_cast<char>(0xC0 | (cp >> 6)), buf_ += static_cast<char>(0x80 | (cp & 0x3F));
    else if (cp < 0x10000)
      buf_ += static_cast<char>(0xE0 | (cp >> 12)), buf_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), buf_ += static_cast<char>(0x80 | (cp & 0x3F));
    else
      buf_ += static_cast<char>(0xF0 | (cp >> 18)), buf_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
          buf_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), buf_ += static_cast<char>(0x80 | (cp & 0x3F));
  }

  [[maybe_unused]] const char* s_;
  const char* p_;
  const char* end_;
  const char* line_start_;
  std::uint32_t line_ = 1;
  bool doc_started_ = false, root_started_ = false;
  int state_ = 0;
  std::vector<Level> stack_;
  std::string buf_;
};

bool is_null_text(std::string_view t) { return t.empty() || t == "~" || t == "null" || t == "Null" || t == "NULL"; }

}  // namespace

std::unique_ptr<EventSource> yaml_events(const std::string& text) { return std::make_unique<YamlSource>(text); }
std::unique_ptr<EventSource> json_events(const std::string& text) { return std::make_unique<JsonSource>(text); }

void require_utf8(const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, b + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The length of the sequence and the range of its second byte (which excludes overlong forms and surrogates).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c == 0xE0)
      len = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC)
      len = 3;
    else if (c == 0xED)
      len = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF)
      len = 3;
    else if (c == 0xF0)
      len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      len = 4;
    else if (c == 0xF4)
      len = 4, hi = 0x8F;
    bool ok = len && i + len <= n && b[i + 1] >= lo && b[i + 1] <= hi;
    for (std::size_t k = 2; ok && k < len; ++k) ok = b[i + k] >= 0x80 && b[i + k] <= 0xBF;
    if (!ok) {
      std::size_t line_start = text.rfind('\n', i ? i - 1 : 0);
      line_start = (line_start == std::string::npos || i == 0) ? 0 : line_start + 1;
      Loc at{static_cast<std::uint32_t>(1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(line_start), '\n')),
             static_cast<std::uint32_t>(i - line_start + 1)};
      static const char hex[] = "0123456789abcdef";
      std::string byte = std::string("0x") + hex[c >> 4] + hex[c & 15];
      throw LoadError(at, "invalid UTF-8: " +
                              (len ? "the character that starts here (byte " + byte + ") is cut short or malformed"
                                   : "byte " + byte + " here cannot start a character") +
                              " (a program file must be UTF-8)");
    }
    i += len;
  }
}

bool looks_like_json(const std::string& text) {
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    return c == '{';
  }
  return false;
}

// ---- Doc -------------------------------------------------------------------------------------

std::uint32_t Doc::add_scalar(Loc loc, std::string_view text, bool quoted) {
  DocNode n;
  n.kind = !quoted && is_null_text(text) ? NodeKind::Null : NodeKind::Scalar;
  n.quoted = quoted;
  n.loc = loc;
  n.text = static_cast<std::uint32_t>(chars.size());
  n.len = static_cast<std::uint32_t>(text.size());
  chars.append(text);
  auto i = static_cast<std::uint32_t>(nodes.size());
  n.end = i + 1;
  nodes.push_back(n);
  return i;
}

std::uint32_t Doc::open(NodeKind k, Loc loc) {
  DocNode n;
  n.kind = k;
  n.loc = loc;
  nodes.push_back(n);
  return static_cast<std::uint32_t>(nodes.size() - 1);
}

void Doc::close(std::uint32_t i) {
  auto end = static_cast<std::uint32_t>(nodes.size());
  nodes[i].end = end;
  std::uint32_t c = 0;
  for (std::uint32_t j = i + 1; j < end; j = nodes[j].end) ++c;
  nodes[i].count = c;
}

NodeKind N::kind() const { return d_ ? d_->nodes[i_].kind : NodeKind::Undefined; }
bool N::streamed() const { return d_ && d_->nodes[i_].streamed; }
std::string_view N::sv() const {
  if (!d_) return {};
  const DocNode& n = d_->nodes[i_];
  if (n.kind != NodeKind::Scalar && n.kind != NodeKind::Null) return {};
  return {d_->chars.data() + n.text, n.len};
}
Loc N::loc() const { return d_ ? d_->nodes[i_].loc : Loc{}; }
std::size_t N::size() const {
  if (!d_) return 0;
  const DocNode& n = d_->nodes[i_];
  return n.kind == NodeKind::Map ? n.count / 2 : n.kind == NodeKind::Seq ? n.count : 0;
}
N N::first_child() const { return {d_, i_ + 1}; }
N N::next_sibling() const { return {d_, d_->nodes[i_].end}; }

N N::key_node(std::string_view key) const {
  if (!IsMap()) return {};
  std::uint32_t end = d_->nodes[i_].end;
  for (std::uint32_t k = i_ + 1; k < end;) {
    std::uint32_t v = d_->nodes[k].end;
    const DocNode& kn = d_->nodes[k];
    if (kn.kind == NodeKind::Scalar && std::string_view(d_->chars.data() + kn.text, kn.len) == key) return {d_, k};
    k = d_->nodes[v].end;
  }
  return {};
}

N N::operator[](std::string_view key) const {
  N k = key_node(key);
  return k.IsDefined() ? k.next_sibling() : N();
}

N N::operator[](std::size_t i) const {
  if (!IsSequence()) return {};
  std::uint32_t c = i_ + 1;
  for (std::size_t j = 0; j < i && c < d_->nodes[i_].end; ++j) c = d_->nodes[c].end;
  return c < d_->nodes[i_].end ? N(d_, c) : N();
}

N::Iter& N::Iter::operator++() {
  i = d->nodes[i].end;
  return *this;
}
N::Iter N::begin() const { return d_ && (IsMap() || IsSequence()) ? Iter{d_, i_ + 1} : Iter{d_, 0}; }
N::Iter N::end() const { return d_ && (IsMap() || IsSequence()) ? Iter{d_, d_->nodes[i_].end} : Iter{d_, 0}; }

std::uint32_t read_node(EventSource& src, Event& e, Doc& doc, int depth) {
  switch (e.type) {
    case EvType::Scalar: return doc.add_scalar(e.loc, e.text, e.quoted);
    case EvType::Alias:
      throw LoadError(e.loc, "aliases (*name) are not supported in a program: write the value out, or use a module for repeated ops");
    case EvType::SeqStart:
    case EvType::MapStart: {
      if (depth >= kMaxDepth) throw LoadError(e.loc, "invalid YAML: nested more than " + std::to_string(kMaxDepth) + " levels deep");
      bool map = e.type == EvType::MapStart;
      std::uint32_t i = doc.open(map ? NodeKind::Map : NodeKind::Seq, e.loc);
      for (;;) {
        src.next(e);
        if (e.type == EvType::SeqEnd || e.type == EvType::MapEnd) break;
        read_node(src, e, doc, depth + 1);
      }
      doc.close(i);
      return i;
    }
    case EvType::DocStart:
    case EvType::DocEnd:
    case EvType::StreamEnd:
    case EvType::SeqEnd:
    case EvType::MapEnd: break;
  }
  throw LoadError(e.loc, "invalid YAML: unexpected end of a node");
}

namespace {
void read_with(EventSource& src, Doc& doc) {
  Event e;
  src.next(e);
  if (e.type == EvType::StreamEnd) return;  // no document: an empty file
  src.next(e);
  if (e.type == EvType::DocEnd) return;
  read_node(src, e, doc);
  src.next(e);  // DocEnd
  src.next(e);
  if (e.type == EvType::DocStart) throw LoadError({e.loc.line, 1}, "a program file holds one YAML document; another document starts here");
}
}  // namespace

void read_document(const std::string& text, Doc& doc) {
  doc.clear();
  require_utf8(text);
  if (looks_like_json(text)) {
    try {
      read_with(*json_events(text), doc);
      return;
    } catch (const NotJson&) {
      doc.clear();
    }
  }
  read_with(*yaml_events(text), doc);
}

}  // namespace spmd
