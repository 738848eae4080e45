// A small XML reader for the subset MSCCL algorithm files and NCCL topology files use, safe on
// hostile input.
//
// Accepted: an optional UTF-8 byte-order mark, an optional leading XML declaration
// (`<?xml ...?>`), comments, one root element, nested elements with single- or double-quoted
// attributes, self-closing tags, and white space between elements. In attribute values the five
// predefined entities (&lt; &gt; &amp; &quot; &apos;) and numeric character references to
// ASCII characters (&#NN; &#xNN; for tab, LF, CR and 0x20 ... 0x7F) are decoded; literal tab,
// LF and CR become spaces (XML attribute-value normalization).
//
// Rejected, with a message naming the byte offset and the line: DOCTYPE (and so any DTD and any
// entity definition), other entities and character references, CDATA sections, processing
// instructions other than the leading declaration, non-white-space text, control characters in
// attribute values, malformed or mismatched tags, duplicate attributes, truncation, and input
// beyond XmlLimits (bytes, nesting depth, attribute value bytes, element count, memory).
//
// The parser is iterative (an explicit stack, no recursion), runs in time linear in the input
// (duplicate-attribute checks sort when an element has many attributes) and uses memory linear
// in the input, charged to XmlLimits::max_memory_bytes as it grows (xml_element_cost and
// xml_attribute_cost).
#pragma once

#include <cstddef>
#include <cstdint>
#include <forward_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/ef/msccl_xml.h"

namespace efccl::ef {

/// One attribute as written (name) and decoded (value).
struct XmlAttribute {
  std::string_view name;
  std::string_view value;
};

/// One element. Attributes and children are ranges of the owning XmlDocument's arrays.
struct XmlElement {
  std::string_view name;
  int line = 0;                  ///< 1-based line of the '<' that opens the element
  std::size_t offset = 0;        ///< byte offset of that '<'
  uint32_t first_attribute = 0;  ///< into XmlDocument's attribute array
  uint32_t attribute_count = 0;
  uint32_t first_child = 0;  ///< into XmlDocument's child-index array
  uint32_t child_count = 0;
};

/// A parsed document. Names and most values are views of the parsed text, which must outlive
/// the document; values that needed entity decoding are owned by the document.
class XmlDocument {
 public:
  XmlDocument() = default;
  XmlDocument(XmlDocument&&) noexcept = default;
  XmlDocument& operator=(XmlDocument&&) noexcept = default;
  XmlDocument(const XmlDocument&) = delete;
  XmlDocument& operator=(const XmlDocument&) = delete;

  const XmlElement& root() const { return elements_.front(); }
  const XmlElement& element(uint32_t index) const { return elements_[index]; }
  std::size_t element_count() const { return elements_.size(); }
  std::span<const XmlAttribute> attributes(const XmlElement& e) const {
    return {attributes_.data() + e.first_attribute, e.attribute_count};
  }
  /// Indices (for element()) of the element's children, in document order.
  std::span<const uint32_t> children(const XmlElement& e) const {
    return {children_.data() + e.first_child, e.child_count};
  }
  /// The value of attribute `name`, or nullopt when the element has none.
  std::optional<std::string_view> attribute(const XmlElement& e, std::string_view name) const;

 private:
  friend class XmlParser;
  std::vector<XmlElement> elements_;  ///< document order; elements_[0] is the root
  std::vector<XmlAttribute> attributes_;
  std::vector<uint32_t> children_;
  std::forward_list<std::string> decoded_values_;  ///< list nodes never move: views stay valid
};

/// Why a document was rejected and where.
struct XmlError {
  std::string message;
  std::size_t offset = 0;  ///< byte offset into the text
  int line = 1;            ///< 1-based
};

/// A document, or the first error that stopped parsing.
struct XmlParseResult {
  std::optional<XmlDocument> document;
  XmlError error;
};

/// The memory budget's estimate of one element: its XmlElement, parent and child indices, each
/// three times (a vector that grows holds its old storage and the new one, twice as large).
inline constexpr std::size_t kXmlElementCost = 3 * (sizeof(XmlElement) + 2 * sizeof(uint32_t));
/// The estimate of one attribute; a value that needed decoding adds its own bytes.
inline constexpr std::size_t kXmlAttributeCost = 3 * sizeof(XmlAttribute);

/// `s` quoted for a diagnostic: at most 24 bytes shown, non-printable bytes as \xNN.
std::string quoted_for_message(std::string_view s);

/// Parses `text` (which must outlive the returned document) within `limits`.
XmlParseResult parse_xml(std::string_view text, const XmlLimits& limits = {});

}  // namespace efccl::ef
