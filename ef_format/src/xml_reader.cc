#include "efccl/ef/xml_reader.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "memory_budget.h"

namespace efccl::ef {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool is_name_start(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' || u == ':' || u >= 0x80;
}

bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
}

}  // namespace

std::string quoted_for_message(std::string_view s) {
  constexpr std::size_t kMaxShown = 24;
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7F && u != '"' && u != '\\') {
      out += static_cast<char>(u);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xF];
    }
  }
  if (s.size() > kMaxShown) out += "...";
  out += '"';
  return out;
}

namespace {

/// The value of a character reference body ("#65", "#x41"), or nullopt when it is malformed
/// or names a character outside the accepted ASCII set (tab, LF, CR, 0x20 ... 0x7F).
std::optional<char> decode_char_reference(std::string_view body) {
  int base = 10;
  body.remove_prefix(1);  // '#'
  if (!body.empty() && body.front() == 'x') {
    base = 16;
    body.remove_prefix(1);
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value, base);
  if (body.empty() || ec != std::errc() || end != body.data() + body.size()) return std::nullopt;
  if (value == '\t' || value == '\n' || value == '\r' || (value >= 0x20 && value <= 0x7F))
    return static_cast<char>(value);
  return std::nullopt;
}

/// The character a predefined entity stands for ("lt" -> '<'), or nullopt.
std::optional<char> decode_predefined_entity(std::string_view name) {
  if (name == "lt") return '<';
  if (name == "gt") return '>';
  if (name == "amp") return '&';
  if (name == "quot") return '"';
  if (name == "apos") return '\'';
  return std::nullopt;
}

}  // namespace

std::optional<std::string_view> XmlDocument::attribute(const XmlElement& e,
                                                       std::string_view name) const {
  for (const XmlAttribute& a : attributes(e))
    if (a.name == name) return a.value;
  return std::nullopt;
}

/// One parse of one text; holds the cursor, the open-element stack and the first error.
class XmlParser {
 public:
  XmlParser(std::string_view text, const XmlLimits& limits)
      : text_(text), limits_(limits), budget_(limits.max_memory_bytes) {}

  XmlParseResult run() {
    if (text_.size() > limits_.max_bytes)
      return failure(0, "the document is " + std::to_string(text_.size()) +
                            " bytes; the limit is " + std::to_string(limits_.max_bytes));
    if (text_.starts_with("\xEF\xBB\xBF")) pos_ = 3;
    if (rest().starts_with("<?xml") && pos_ + 5 < text_.size() &&
        (is_space(text_[pos_ + 5]) || text_[pos_ + 5] == '?')) {
      if (!parse_declaration()) return failure();
    }
    while (true) {
      skip_spaces();
      if (pos_ >= text_.size()) break;
      if (text_[pos_] != '<')
        return failure(pos_, "unexpected text " + quoted_for_message(rest()) +
                                 "; only white space may appear between elements");
      bool ok = false;
      if (rest().starts_with("<!--")) {
        ok = parse_comment();
      } else if (rest().starts_with("<!")) {
        ok = reject_markup_declaration();
      } else if (rest().starts_with("<?")) {
        ok = fail(pos_, "processing instruction " + quoted_for_message(rest()) +
                            " is not accepted; only a leading <?xml ...?> declaration is");
      } else if (rest().starts_with("</")) {
        ok = parse_end_tag();
      } else {
        ok = parse_start_tag();
      }
      if (!ok) return failure();
    }
    if (!open_.empty()) {
      const XmlElement& e = doc_.elements_[open_.back()];
      return failure(text_.size(), "unexpected end of the document: <" + std::string(e.name) +
                                       "> opened on line " + std::to_string(e.line) +
                                       " is not closed");
    }
    if (doc_.elements_.empty()) return failure(text_.size(), "the document has no element");
    link_children();
    XmlParseResult result;
    result.document = std::move(doc_);
    return result;
  }

 private:
  std::string_view rest() const { return text_.substr(std::min(pos_, text_.size())); }

  /// Records the first error; returns false so that callers can `return fail(...)`.
  bool fail(std::size_t offset, std::string message) {
    if (!error_) error_ = XmlError{std::move(message), offset, line_at(offset)};
    return false;
  }
  XmlParseResult failure() { return XmlParseResult{std::nullopt, std::move(*error_)}; }
  XmlParseResult failure(std::size_t offset, std::string message) {
    fail(offset, std::move(message));
    return failure();
  }

  /// 1-based line of `offset`. Queries are almost always increasing, so the count continues
  /// from the previous query and the whole parse counts each newline once.
  int line_at(std::size_t offset) {
    offset = std::min(offset, text_.size());
    if (offset < line_offset_) {
      line_offset_ = 0;
      line_ = 1;
    }
    line_ += static_cast<int>(
        std::count(text_.begin() + static_cast<std::ptrdiff_t>(line_offset_),
                   text_.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
    line_offset_ = offset;
    return line_;
  }

  /// Adds `bytes` to the document's estimated size; past the budget, fails at `offset`.
  bool charge(std::size_t bytes, std::size_t offset) {
    if (budget_.charge(bytes)) return true;
    return fail(offset, budget_.exceeded_message("element or attribute"));
  }

  /// Skips white space; returns whether there was any.
  bool skip_spaces() {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
    return pos_ != start;
  }

  std::string_view parse_name() {
    const std::size_t start = pos_;
    if (pos_ >= text_.size() || !is_name_start(text_[pos_])) return {};
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  /// "found ..." for messages: the text at `offset`, or the end of the document.
  std::string found_at(std::size_t offset) const {
    if (offset >= text_.size()) return "the end of the document";
    return quoted_for_message(text_.substr(offset, 1));
  }

  bool parse_declaration() {
    const std::size_t start = pos_;
    const std::size_t close = text_.find("?>", pos_);
    if (close == std::string_view::npos)
      return fail(start, "unexpected end of the document inside the <?xml ...?> declaration");
    if (text_.substr(start, close - start).find('<', 1) != std::string_view::npos)
      return fail(start, "the <?xml ...?> declaration is not closed by '?>' before the next '<'");
    pos_ = close + 2;
    return true;
  }

  bool parse_comment() {
    const std::size_t start = pos_;
    const std::size_t dashes = text_.find("--", pos_ + 4);
    if (dashes == std::string_view::npos || dashes + 2 >= text_.size())
      return fail(start, "unexpected end of the document inside a comment");
    if (text_[dashes + 2] != '>') return fail(dashes, "'--' inside a comment");
    pos_ = dashes + 3;
    return true;
  }

  bool reject_markup_declaration() {
    if (rest().starts_with("<!DOCTYPE"))
      return fail(pos_,
                  "DOCTYPE declarations are not accepted: MSCCL files need no DTD, and DTD "
                  "entities could expand without bound");
    if (rest().starts_with("<![CDATA["))
      return fail(pos_, "CDATA sections are not accepted: MSCCL files have no text content");
    return fail(pos_, "markup declaration " + quoted_for_message(rest()) + " is not accepted");
  }

  bool parse_start_tag() {
    const std::size_t start = pos_;
    if (root_closed_)
      return fail(start, "a second top-level element; a document has exactly one root element");
    if (open_.size() >= static_cast<std::size_t>(std::max(limits_.max_depth, 0)))
      return fail(start, "elements nested deeper than the limit of " +
                             std::to_string(limits_.max_depth));
    if (doc_.elements_.size() >= limits_.max_elements ||
        doc_.elements_.size() >= std::numeric_limits<uint32_t>::max())
      return fail(start, "more elements than the limit of " +
                             std::to_string(limits_.max_elements));
    if (!charge(kXmlElementCost, start)) return false;
    ++pos_;
    XmlElement element;
    element.name = parse_name();
    if (element.name.empty())
      return fail(pos_, "expected an element name after '<', found " + found_at(pos_));
    element.line = line_at(start);
    element.offset = start;
    element.first_attribute = static_cast<uint32_t>(doc_.attributes_.size());
    // Messages are built only on failure: this loop runs for every attribute of the file.
    const auto tag = [&] { return "<" + std::string(element.name) + ">"; };

    bool self_closing = false;
    while (true) {
      const bool spaced = skip_spaces();
      if (pos_ >= text_.size())
        return fail(start, "unexpected end of the document inside the start tag of " + tag());
      if (text_[pos_] == '>') {
        ++pos_;
        break;
      }
      if (text_[pos_] == '/') {
        if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '>') {
          pos_ += 2;
          self_closing = true;
          break;
        }
        return fail(pos_, "expected '/>' to end " + tag() + ", found " + found_at(pos_ + 1));
      }
      if (!spaced)
        return fail(pos_, "expected white space, '>' or '/>' in " + tag() + ", found " +
                              found_at(pos_));
      if (!parse_attribute(element.name)) return false;
      if (doc_.attributes_.size() >= std::numeric_limits<uint32_t>::max())
        return fail(pos_, "too many attributes in the document");
      ++element.attribute_count;
    }
    if (!check_unique_attributes(element)) return false;

    const auto index = static_cast<uint32_t>(doc_.elements_.size());
    doc_.elements_.push_back(element);
    parents_.push_back(open_.empty() ? kNoParent : open_.back());
    if (!self_closing) {
      open_.push_back(index);
    } else if (open_.empty()) {
      root_closed_ = true;
    }
    return true;
  }

  bool parse_attribute(std::string_view element_name) {
    const auto tag = [&] { return "<" + std::string(element_name) + ">"; };
    XmlAttribute attribute;
    const std::size_t attribute_start = pos_;
    attribute.name = parse_name();
    if (attribute.name.empty())
      return fail(pos_, "expected an attribute name in " + tag() + ", found " + found_at(pos_));
    skip_spaces();
    if (pos_ >= text_.size() || text_[pos_] != '=')
      return fail(pos_, "expected '=' after attribute " + std::string(attribute.name) + " in " +
                            tag() + ", found " + found_at(pos_));
    ++pos_;
    skip_spaces();
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\''))
      return fail(pos_, "expected a quoted value for attribute " + std::string(attribute.name) +
                            " in " + tag() + ", found " + found_at(pos_));
    if (!charge(kXmlAttributeCost, attribute_start)) return false;
    if (!parse_attribute_value(attribute)) return false;
    doc_.attributes_.push_back(attribute);
    return true;
  }

  /// Reads the quoted value at pos_ into `attribute.value`, decoding references if any.
  bool parse_attribute_value(XmlAttribute& attribute) {
    const auto what = [&] { return "the value of attribute " + std::string(attribute.name); };
    const char quote = text_[pos_];
    const std::size_t begin = pos_ + 1;
    const std::size_t available = text_.size() - begin;
    // Scan at most max_attribute_bytes value bytes plus the closing quote.
    const std::size_t scan_end =
        begin + std::min(available, limits_.max_attribute_bytes) +
        (available > limits_.max_attribute_bytes ? 1 : 0);
    bool needs_decoding = false;
    std::size_t i = begin;
    for (; i < scan_end && text_[i] != quote; ++i) {
      const char c = text_[i];
      if (c == '<') return fail(i, "'<' in " + what() + " (write &lt;)");
      if (c == '&' || c == '\t' || c == '\n' || c == '\r') {
        needs_decoding = true;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return fail(i, "control character " + quoted_for_message(text_.substr(i, 1)) + " in " +
                           what());
      }
    }
    if (i == scan_end) {
      if (scan_end == text_.size())
        return fail(pos_, "unexpected end of the document inside " + what());
      return fail(pos_, what() + " is longer than the limit of " +
                            std::to_string(limits_.max_attribute_bytes) + " bytes");
    }
    const std::string_view raw = text_.substr(begin, i - begin);
    pos_ = i + 1;
    if (!needs_decoding) {
      attribute.value = raw;
      return true;
    }
    // The list node and the string's own block, besides the bytes.
    if (!charge(raw.size() + 1 + sizeof(std::string) + 48, begin)) return false;
    std::string decoded;
    decoded.reserve(raw.size());
    for (std::size_t k = 0; k < raw.size(); ++k) {
      const char c = raw[k];
      if (c == '\t' || c == '\n' || c == '\r') {
        decoded += ' ';
        continue;
      }
      if (c != '&') {
        decoded += c;
        continue;
      }
      // The longest accepted reference body is "#x0007F" style; bound the search for ';'.
      constexpr std::size_t kMaxReferenceBody = 8;
      const std::size_t semicolon = raw.substr(k + 1, kMaxReferenceBody + 1).find(';');
      const std::size_t offset = begin + k;
      if (semicolon == std::string_view::npos)
        return fail(offset, "'&' in " + what() +
                                " does not start a reference ending in ';' (write &amp;)");
      const std::string_view body = raw.substr(k + 1, semicolon);
      const std::optional<char> value = body.starts_with("#") ? decode_char_reference(body)
                                                              : decode_predefined_entity(body);
      if (!value)
        return fail(offset, "reference " + quoted_for_message(raw.substr(k, semicolon + 2)) +
                                " in " + what() +
                                " is not accepted; only &lt; &gt; &amp; &quot; &apos; and "
                                "character references to tab, LF, CR and 0x20-0x7F are");
      decoded += *value;
      k += semicolon + 1;
    }
    doc_.decoded_values_.push_front(std::move(decoded));
    attribute.value = doc_.decoded_values_.front();
    return true;
  }

  /// Rejects a repeated attribute name: pairwise for the usual few attributes, by sorting a
  /// copy of the names for many, so that hostile elements stay linear-logarithmic.
  bool check_unique_attributes(const XmlElement& element) {
    const auto attributes = doc_.attributes(element);
    const XmlAttribute* repeated = nullptr;
    constexpr std::size_t kPairwiseLimit = 16;
    if (attributes.size() <= kPairwiseLimit) {
      for (std::size_t i = 1; i < attributes.size() && !repeated; ++i)
        for (std::size_t j = 0; j < i && !repeated; ++j)
          if (attributes[i].name == attributes[j].name) repeated = &attributes[i];
    } else {
      names_.clear();
      for (const XmlAttribute& a : attributes) names_.push_back(a.name);
      std::sort(names_.begin(), names_.end());
      const auto it = std::adjacent_find(names_.begin(), names_.end());
      if (it != names_.end()) {
        // Report the later occurrence: its name is the later view into the text.
        for (const XmlAttribute& a : attributes)
          if (a.name == *it) repeated = &a;
      }
    }
    if (!repeated) return true;
    return fail(static_cast<std::size_t>(repeated->name.data() - text_.data()),
                "duplicate attribute " + std::string(repeated->name) + " in <" +
                    std::string(element.name) + ">");
  }

  bool parse_end_tag() {
    const std::size_t start = pos_;
    pos_ += 2;
    const std::string_view name = parse_name();
    if (name.empty())
      return fail(pos_, "expected an element name after '</', found " + found_at(pos_));
    skip_spaces();
    if (pos_ >= text_.size() || text_[pos_] != '>')
      return fail(pos_, "expected '>' to end </" + std::string(name) + ">, found " +
                            found_at(pos_));
    ++pos_;
    if (open_.empty())
      return fail(start, "closing tag </" + std::string(name) + "> has no matching start tag");
    const XmlElement& open = doc_.elements_[open_.back()];
    if (open.name != name)
      return fail(start, "closing tag </" + std::string(name) + "> does not match <" +
                             std::string(open.name) + "> opened on line " +
                             std::to_string(open.line));
    open_.pop_back();
    if (open_.empty()) root_closed_ = true;
    return true;
  }

  /// Lays out each element's children contiguously (counting sort by parent).
  void link_children() {
    auto& elements = doc_.elements_;
    for (uint32_t parent : parents_)
      if (parent != kNoParent) ++elements[parent].child_count;
    uint32_t next = 0;
    for (XmlElement& e : elements) {
      e.first_child = next;
      next += e.child_count;
      e.child_count = 0;
    }
    doc_.children_.resize(next);
    for (uint32_t i = 0; i < elements.size(); ++i) {
      const uint32_t parent = parents_[i];
      if (parent == kNoParent) continue;
      XmlElement& p = elements[parent];
      doc_.children_[p.first_child + p.child_count++] = i;
    }
  }

  static constexpr uint32_t kNoParent = std::numeric_limits<uint32_t>::max();

  std::string_view text_;
  const XmlLimits& limits_;
  std::size_t pos_ = 0;
  MemoryBudget budget_;  ///< charged for doc_, parents_ and decoded values
  XmlDocument doc_;
  std::vector<uint32_t> parents_;  ///< parent index of each element (kNoParent for the root)
  std::vector<uint32_t> open_;     ///< indices of the elements not yet closed, outermost first
  bool root_closed_ = false;
  std::vector<std::string_view> names_;  ///< scratch for check_unique_attributes
  std::size_t line_offset_ = 0;          ///< line_at's cache: line_ is the line of this offset
  int line_ = 1;
  std::optional<XmlError> error_;
};

XmlParseResult parse_xml(std::string_view text, const XmlLimits& limits) {
  return XmlParser(text, limits).run();
}

}  // namespace efccl::ef
