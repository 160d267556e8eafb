// ir/doc.h - parse events (libyaml, or a hand-written JSON fast path) and a compact subtree built from them.
//
// The loader never builds a tree of the whole file: it reads the top-level keys one at a time and the items of
// long lists (`ops`, `programs`) one item at a time into a Doc it reuses. A Doc stores its nodes in preorder in
// one vector (a node's descendants follow it), scalars in one character arena, and a position for every node.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/diagnostic.h"

namespace spmd {

enum class EvType : std::uint8_t { DocStart, DocEnd, StreamEnd, Scalar, Alias, SeqStart, SeqEnd, MapStart, MapEnd };

struct Event {
  EvType type = EvType::StreamEnd;
  bool quoted = false;    // a quoted scalar (never null)
  bool implicit = true;   // DocStart without `---`
  Loc loc;
  std::string_view text;  // Scalar: its value (valid until the next event)
};

// A raw position in a JSON text, for the loader's direct path (ir/loader_json.cpp): it reads an op or a tensor
// straight from the characters and hands the position back, or leaves the item to the events.
struct RawJson {
  const char* p;
  const char* end;
  const char* line_start;
  std::uint32_t line;
  Loc here() const { return {line, static_cast<std::uint32_t>(p - line_start + 1)}; }
};

// A stream of parse events over a whole text. Syntax errors throw LoadError at their position.
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual void next(Event& e) = 0;
  // JSON only: positions `at` on the next item of the list being read (on its `{`) when that item is an object,
  // or on the next key of the object being read (on its opening quote); false (nothing consumed) otherwise.
  virtual bool raw_item(RawJson& at) { return (void)at, false; }
  // Continues after an item or entry that was read directly up to `at`.
  virtual void raw_commit(const RawJson& at) { (void)at; }
};

// libyaml over `text` (which must outlive the source); error messages say what was expected where.
std::unique_ptr<EventSource> yaml_events(const std::string& text);
// Strict JSON (RFC 8259) over `text`; throws NotJson where the text stops being JSON (the caller then parses
// it as YAML, which decides whether it is valid).
std::unique_ptr<EventSource> json_events(const std::string& text);
struct NotJson {};
// Whether the first character that is not white space is '{' (a JSON object; the fast path is worth a try).
bool looks_like_json(const std::string& text);

// Throws LoadError at the first byte that is not UTF-8 (RFC 3629: no overlong forms, surrogates or values above
// U+10FFFF), so the YAML and JSON readers accept exactly the same texts. Linear, eight bytes a step over ASCII.
void require_utf8(const std::string& text);

enum class NodeKind : std::uint8_t { Undefined, Null, Scalar, Seq, Map };

struct DocNode {
  NodeKind kind = NodeKind::Null;
  bool quoted = false;
  bool streamed = false;     // a list whose items were loaded as they were read (its children are not kept)
  Loc loc;
  std::uint32_t end = 0;     // index after the last descendant
  std::uint32_t count = 0;   // children (a mapping: keys and values, so twice its size)
  std::uint32_t text = 0, len = 0;  // scalar text in Doc::chars
};

class Doc;

// A handle to one node of a Doc (or an undefined node). Cheap to copy.
class N {
 public:
  N() = default;
  N(const Doc* d, std::uint32_t i) : d_(d), i_(i) {}
  bool IsDefined() const { return kind() != NodeKind::Undefined; }
  bool IsNull() const { return kind() == NodeKind::Null; }
  bool IsScalar() const { return kind() == NodeKind::Scalar; }
  bool IsMap() const { return kind() == NodeKind::Map; }
  bool IsSequence() const { return kind() == NodeKind::Seq; }
  bool streamed() const;
  std::string_view sv() const;
  std::string Scalar() const { return std::string(sv()); }
  Loc loc() const;
  std::size_t size() const;                 // items of a list, keys of a mapping
  N operator[](std::string_view key) const; // a mapping's value (undefined if absent)
  N key_node(std::string_view key) const;   // a mapping's key node (undefined if absent)
  N operator[](std::size_t i) const;        // a list's item
  N first_child() const;
  N next_sibling() const;                   // within the parent (valid only while below the parent's end)
  const Doc* doc() const { return d_; }
  std::uint32_t index() const { return i_; }

  // Iterates a list's items (a mapping's keys and values alternate).
  struct Iter {
    const Doc* d;
    std::uint32_t i;
    N operator*() const { return {d, i}; }
    Iter& operator++();
    bool operator!=(const Iter& o) const { return i != o.i; }
  };
  Iter begin() const;
  Iter end() const;

 private:
  NodeKind kind() const;
  const Doc* d_ = nullptr;
  std::uint32_t i_ = 0;
};

class Doc {
 public:
  std::vector<DocNode> nodes;
  std::string chars;
  void clear() {
    nodes.clear();
    chars.clear();
  }
  N root() const { return nodes.empty() ? N() : N(this, 0); }
  N at(std::uint32_t i) const { return {this, i}; }
  std::uint32_t add_scalar(Loc loc, std::string_view text, bool quoted);
  std::uint32_t open(NodeKind k, Loc loc);  // a list or mapping; children follow, then close()
  void close(std::uint32_t i);
};

// Reads one complete node (starting with the event `first`) from `src` into `doc`; returns its index.
// Nesting deeper than kMaxDepth levels is a located error; aliases are refused (a program has no anchors).
inline constexpr int kMaxDepth = 499;
std::uint32_t read_node(EventSource& src, Event& first, Doc& doc, int depth = 0);

// Reads a whole text (one document) into `doc` (JSON fast path, else YAML); root undefined if the file is empty.
void read_document(const std::string& text, Doc& doc);  // require_utf8 first

}  // namespace spmd
