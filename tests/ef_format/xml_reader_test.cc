#include "efccl/ef/xml_reader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "msccl_corpus.h"

namespace efccl::ef {
namespace {

using Clock = std::chrono::steady_clock;

XmlDocument parse_ok(std::string_view text, const XmlLimits& limits = {}) {
  XmlParseResult result = parse_xml(text, limits);
  EXPECT_TRUE(result.document.has_value()) << result.error.message << " at byte "
                                           << result.error.offset;
  return result.document ? std::move(*result.document) : XmlDocument{};
}

/// Parses text that must be rejected; checks the message mentions `words` and the line.
XmlError parse_error(std::string_view text, std::string_view words, int line,
                     const XmlLimits& limits = {}) {
  XmlParseResult result = parse_xml(text, limits);
  EXPECT_FALSE(result.document.has_value()) << "accepted: " << text.substr(0, 200);
  EXPECT_NE(result.error.message.find(words), std::string::npos)
      << "message: " << result.error.message << "\nexpected it to mention: " << words;
  EXPECT_EQ(result.error.line, line) << result.error.message;
  return result.error;
}

std::string read_corpus_file(const std::string& name) {
  std::ifstream in(test_support::msccl_corpus_file(name), std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

constexpr std::string_view kSmall =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<!-- a comment -->\n"
    "<algo name='ring &amp; &lt;tree&gt;' proto=\"LL\">\n"
    "  <gpu id=\"0\">\n"
    "    <tb id=\"0\"/>\n"
    "    <tb id = \"1\" ><step s=\"0\"/></tb>\n"
    "  </gpu>\n"
    "  <!-- between -->\n"
    "  <gpu id=\"1\"></gpu>\n"
    "</algo>\n"
    "<!-- trailing -->\n";

TEST(XmlReader, BuildsTheTreeWithAttributesChildrenAndLines) {
  const XmlDocument doc = parse_ok(kSmall);
  ASSERT_EQ(doc.element_count(), 6u);
  const XmlElement& algo = doc.root();
  EXPECT_EQ(algo.name, "algo");
  EXPECT_EQ(algo.line, 3);
  ASSERT_EQ(doc.attributes(algo).size(), 2u);
  EXPECT_EQ(doc.attributes(algo)[0].name, "name");
  EXPECT_EQ(doc.attributes(algo)[0].value, "ring & <tree>");
  EXPECT_EQ(doc.attribute(algo, "proto"), "LL");
  EXPECT_EQ(doc.attribute(algo, "missing"), std::nullopt);

  ASSERT_EQ(doc.children(algo).size(), 2u);
  const XmlElement& gpu0 = doc.element(doc.children(algo)[0]);
  const XmlElement& gpu1 = doc.element(doc.children(algo)[1]);
  EXPECT_EQ(doc.attribute(gpu0, "id"), "0");
  EXPECT_EQ(doc.attribute(gpu1, "id"), "1");
  EXPECT_EQ(gpu1.line, 9);
  EXPECT_TRUE(doc.children(gpu1).empty());

  ASSERT_EQ(doc.children(gpu0).size(), 2u);
  const XmlElement& tb0 = doc.element(doc.children(gpu0)[0]);
  const XmlElement& tb1 = doc.element(doc.children(gpu0)[1]);
  EXPECT_EQ(tb0.line, 5);
  EXPECT_TRUE(doc.children(tb0).empty());
  EXPECT_EQ(doc.attribute(tb1, "id"), "1");
  ASSERT_EQ(doc.children(tb1).size(), 1u);
  const XmlElement& step = doc.element(doc.children(tb1)[0]);
  EXPECT_EQ(step.name, "step");
  EXPECT_EQ(step.line, 6);
  EXPECT_EQ(doc.attribute(step, "s"), "0");
}

TEST(XmlReader, DecodesReferencesAndNormalizesWhitespaceInValues) {
  const XmlDocument doc =
      parse_ok("<a x=\"&quot;&apos;&#65;&#x42;&#9;\" y='a\tb\nc\r' z=\"it's\" w='\"'/>");
  ASSERT_EQ(doc.element_count(), 1u);
  EXPECT_EQ(doc.attribute(doc.root(), "x"), "\"'AB\t");
  EXPECT_EQ(doc.attribute(doc.root(), "y"), "a b c ");
  EXPECT_EQ(doc.attribute(doc.root(), "z"), "it's");
  EXPECT_EQ(doc.attribute(doc.root(), "w"), "\"");
}

TEST(XmlReader, AcceptsByteOrderMarkAndSelfClosingRoot) {
  const XmlDocument doc = parse_ok("\xEF\xBB\xBF<?xml version='1.0'?><algo/>");
  ASSERT_EQ(doc.element_count(), 1u);
  EXPECT_EQ(doc.root().name, "algo");
}

TEST(XmlReader, DocumentOwnsDecodedValuesAfterMove) {
  XmlDocument moved = parse_ok("<a v=\"x&amp;y\"/>");
  const XmlDocument doc = std::move(moved);
  ASSERT_EQ(doc.element_count(), 1u);
  EXPECT_EQ(doc.attribute(doc.root(), "v"), "x&y");
}

TEST(XmlReader, RejectsDoctype) {
  parse_error("<?xml version=\"1.0\"?>\n<!DOCTYPE algo [<!ENTITY x \"y\">]>\n<algo/>", "DOCTYPE",
              2);
}

TEST(XmlReader, RejectsUndefinedEntities) {
  parse_error("<algo\n name=\"&lol9;\"/>", "&lol9;", 2);
  parse_error("<algo name=\"&#0;\"/>", "&#0;", 1);       // not an XML character
  parse_error("<algo name=\"&#233;\"/>", "&#233;", 1);   // beyond ASCII: not accepted
  parse_error("<algo name=\"&#x1F;\"/>", "&#x1F;", 1);   // control character
  parse_error("<algo name=\"a & b\"/>", "'&'", 1);
}

TEST(XmlReader, RejectsCdata) { parse_error("<algo>\n<![CDATA[x]]></algo>", "CDATA", 2); }

TEST(XmlReader, RejectsProcessingInstructions) {
  parse_error("<algo>\n\n<?php echo ?></algo>", "processing instruction", 3);
  parse_error("<!-- c -->\n<?xml version=\"1.0\"?><algo/>", "processing instruction", 2);
  parse_error("<?xml-stylesheet href='a'?><algo/>", "processing instruction", 1);
}

TEST(XmlReader, RejectsTextContent) {
  parse_error("<algo>\n  <gpu>hello</gpu></algo>", "unexpected text \"hello", 2);
  parse_error("garbage", "unexpected text", 1);
}

TEST(XmlReader, RejectsMismatchedAndStrayClosingTags) {
  const XmlError e = parse_error("<algo>\n<gpu>\n</tb>\n</algo>", "</tb>", 3);
  EXPECT_NE(e.message.find("<gpu> opened on line 2"), std::string::npos) << e.message;
  EXPECT_EQ(e.offset, 13u);
  parse_error("<algo/>\n</algo>", "no matching start tag", 2);
}

TEST(XmlReader, RejectsUnclosedElements) {
  parse_error("<algo>\n  <gpu>\n", "<gpu> opened on line 2 is not closed", 3);
}

TEST(XmlReader, RejectsDuplicateAttributes) {
  parse_error("<algo>\n<gpu id=\"1\" x=\"2\" id=\"3\"/></algo>", "duplicate attribute id", 2);
  // Many attributes take the sorting path; the duplicate is still found and named.
  std::string many = "<a";
  for (int i = 0; i < 100; ++i) many += " a" + std::to_string(i) + "=\"\"";
  many += "\n a57=\"\"/>";
  parse_error(many, "duplicate attribute a57", 2);
}

TEST(XmlReader, RejectsMalformedTags) {
  parse_error("<algo x=\"1\"y=\"2\"/>", "expected white space", 1);
  parse_error("<algo x/>", "expected '='", 1);
  parse_error("<algo x=1/>", "expected a quoted value", 1);
  parse_error("<algo x=\"<\"/>", "'<' in the value", 1);
  parse_error("<algo x=\"\x01\"/>", "control character", 1);
  parse_error("< algo/>", "expected an element name", 1);
  parse_error("<algo /x>", "expected '/>'", 1);
  parse_error("<algo></ >", "expected an element name after '</'", 1);
  parse_error("<algo></algo x>", "expected '>'", 1);
  parse_error("<!-- a -- b -->\n<algo/>", "'--' inside a comment", 1);
  parse_error("<!ELEMENT algo ANY>", "markup declaration", 1);
}

TEST(XmlReader, RejectsMissingOrSecondRoot) {
  parse_error("<!-- only -->\n", "no element", 2);
  parse_error("", "no element", 1);
  parse_error("<algo/>\n<algo/>", "second top-level element", 2);
}

TEST(XmlReader, RejectsDepthAboveLimit) {
  XmlLimits limits;
  limits.max_depth = 3;
  parse_ok("<a><b><c/></b></a>", limits);
  parse_error("<a>\n<b>\n<c>\n<d/></c></b></a>", "nested deeper than the limit of 3", 4, limits);
}

TEST(XmlReader, RejectsAttributeAboveLimit) {
  XmlLimits limits;
  limits.max_attribute_bytes = 4;
  parse_ok("<a v=\"1234\"/>", limits);
  parse_error("<a\nv=\"12345\"/>", "longer than the limit of 4 bytes", 2, limits);
}

TEST(XmlReader, RejectsDocumentAboveLimit) {
  XmlLimits limits;
  limits.max_bytes = 10;
  parse_ok("<algo   />", limits);
  parse_error("<algo    />", "11 bytes; the limit is 10", 1, limits);
}

TEST(XmlReader, RejectsDocumentsAboveTheMemoryBudget) {
  XmlLimits limits;
  limits.max_memory_bytes = 10 * kXmlElementCost + 4 * kXmlAttributeCost;
  parse_ok("<a x=\"1\"><b y=\"2\" z=\"3\"/><c/><d/><e/><f/><g/><h/><i/><j w=\"4\"/></a>", limits);
  parse_error("<a x=\"1\"><b y=\"2\" z=\"3\"/><c/><d/><e/><f/><g/><h/><i/><j w=\"4\" v=\"5\"/></a>",
              "the loaders' budget (stopped at element or attribute 15)", 1, limits);
  limits.max_memory_bytes = 10 * kXmlElementCost;
  const XmlError e = parse_error("<a>\n<b/><c/><d/><e/><f/><g/><h/><i/><j/>\n<k/></a>",
                                 "of memory, the loaders' budget (stopped at element or attribute 11)",
                                 3, limits);
  EXPECT_EQ(e.offset, 41u);  // the <k/> that did not fit
  // A decoded value is charged its bytes too.
  limits.max_memory_bytes = kXmlElementCost + kXmlAttributeCost + 100;
  parse_ok("<a v=\"&lt;\"/>", limits);
  parse_error("<a v=\"" + std::string(100, 'x') + "&lt;\"/>", "the loaders' budget", 1, limits);
}

TEST(XmlReader, RejectsElementCountAboveLimit) {
  XmlLimits limits;
  limits.max_elements = 3;
  parse_ok("<a><b/><c/></a>", limits);
  parse_error("<a><b/><c/>\n<d/></a>", "more elements than the limit of 3", 2, limits);
}

TEST(XmlReader, ReportsTruncationInsideEachConstruct) {
  parse_error("<?xml version=\"1.0\"", "inside the <?xml ...?> declaration", 1);
  parse_error("<algo>\n<!-- open", "inside a comment", 2);
  parse_error("<algo\n name=", "expected a quoted value", 2);
  parse_error("<algo name=\"abc", "inside the value of attribute name", 1);
  parse_error("<algo name=\"abc\"", "inside the start tag of <algo>", 1);
  parse_error("<algo></algo", "expected '>'", 1);
}

// ---- Hostile input: each rejected, quickly ----

TEST(XmlReaderHostile, BillionLaughsIsRejectedAtTheDoctype) {
  std::string text = "<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n <!ENTITY lol \"lol\">\n";
  for (int i = 1; i <= 9; ++i) {
    const std::string previous = i == 1 ? "&lol;" : "&lol" + std::to_string(i - 1) + ";";
    text += " <!ENTITY lol" + std::to_string(i) + " \"";
    for (int k = 0; k < 10; ++k) text += previous;
    text += "\">\n";
  }
  text += "]>\n<algo name=\"&lol9;\"/>\n";
  const auto start = Clock::now();
  parse_error(text, "DOCTYPE", 2);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST(XmlReaderHostile, DeepNestingIsRejectedWithoutRecursion) {
  constexpr int kDepth = 200000;
  std::string text;
  for (int i = 0; i < kDepth; ++i) text += "<a>\n";
  for (int i = 0; i < kDepth; ++i) text += "</a>";
  const auto start = Clock::now();
  parse_error(text, "nested deeper than the limit of 16", 17);
  // Even with the limit lifted the explicit stack copes: no recursion to overflow.
  XmlLimits unlimited;
  unlimited.max_depth = kDepth;
  const XmlDocument doc = parse_ok(text, unlimited);
  EXPECT_EQ(doc.element_count(), static_cast<std::size_t>(kDepth));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST(XmlReaderHostile, HugeAttributeIsRejectedAfterTheLimit) {
  std::string text = "<algo name=\"";
  text.append(20u << 20, 'x');
  text += "\"/>";
  const auto start = Clock::now();
  const XmlError e = parse_error(text, "longer than the limit of 4096 bytes", 1);
  EXPECT_EQ(e.offset, 11u);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200));
}

TEST(XmlReaderHostile, EveryTruncationOfAValidFileIsRejected) {
  const std::string_view text = kSmall.substr(0, kSmall.find("<!-- trailing"));
  const std::string_view complete = text.substr(0, text.rfind('>') + 1);
  for (std::size_t n = 0; n < complete.size(); ++n) {
    const XmlParseResult result = parse_xml(complete.substr(0, n));
    EXPECT_FALSE(result.document.has_value()) << "accepted a prefix of " << n << " bytes";
    EXPECT_FALSE(result.error.message.empty());
    EXPECT_LE(result.error.offset, n);
  }
  EXPECT_TRUE(parse_xml(complete).document.has_value());
}

TEST(XmlReaderHostile, RandomBytesNeverCrash) {
  std::mt19937 rng(1234);
  const std::string alphabet = "<>/=\"'&;#!?-[] \n\tabx01";
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text(rng() % 200, '\0');
    for (char& c : text)
      c = round % 2 ? static_cast<char>(rng()) : alphabet[rng() % alphabet.size()];
    const XmlParseResult result = parse_xml(text);
    if (result.document) {
      ++accepted;
      EXPECT_GE(result.document->element_count(), 1u);
    } else {
      EXPECT_FALSE(result.error.message.empty());
      EXPECT_LE(result.error.offset, text.size());
      EXPECT_GE(result.error.line, 1);
    }
  }
  EXPECT_LT(accepted, 3000);  // random text is almost never XML
}

TEST(XmlReaderCorpus, ParsesTheLargestCorpusFileQuickly) {
  EFCCL_REQUIRE_MSCCL_CORPUS();
  const std::string text = read_corpus_file("all-reduce-ring-ll.xml");
  ASSERT_GT(text.size(), 1000000u) << "corpus file missing in " << test_support::msccl_corpus_dir();
  const auto start = Clock::now();
  const XmlDocument doc = parse_ok(text);
  const auto elapsed = Clock::now() - start;
  // 1 algo + 16 gpu + 16 * 24 tb + 11904 step.
  ASSERT_EQ(doc.element_count(), 1u + 16u + 384u + 11904u);
  EXPECT_EQ(doc.root().line, 3);
  EXPECT_EQ(doc.children(doc.root()).size(), 16u);
  EXPECT_LT(elapsed, std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace efccl::ef
