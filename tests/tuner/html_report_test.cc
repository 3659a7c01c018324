// The HTML/SVG tune report: every file is well-formed XML (a strict little
// parser below checks), the charts hold the expected series and bars, the
// page embeds them with the recommendation, and text is escaped.
#include "tuner/html_report.h"

#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trace/trace_builder.h"
#include "allocator/config_check.h"
#include "tuner/search_space.h"
#include "tuner/text_report.h"
#include "tuner/tuner.h"

namespace allocd {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// ---------------------------------------------------------------------------
// A strict XML well-formedness checker: elements nest and close in order,
// one root, attribute values quoted, every '&' starts an entity XML knows
// (or a character reference), no '<' outside markup. A leading HTML5
// <!DOCTYPE html> is allowed; comments, CDATA and processing instructions
// are not (the report writes none).

struct Element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::string text;  // the element's own character data, unescaped
};

class XmlChecker {
 public:
  explicit XmlChecker(std::string doc) : doc_(std::move(doc)) {}

  absl::StatusOr<std::vector<Element>> Parse() {
    if (absl::StartsWith(doc_, "<!DOCTYPE html>")) pos_ = 15;
    std::vector<size_t> open;  // indices into elements_
    int roots = 0;
    while (pos_ < doc_.size()) {
      if (doc_[pos_] != '<') {
        std::string text;
        if (absl::Status s = CharData(text); !s.ok()) return s;
        if (open.empty()) {
          if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
            return Error("text outside the root element");
          }
        } else {
          elements_[open.back()].text += text;
        }
        continue;
      }
      if (doc_.compare(pos_, 2, "</") == 0) {
        pos_ += 2;
        const std::string name = Name();
        SkipSpace();
        if (name.empty() || !Take('>')) return Error("malformed end tag");
        if (open.empty() || elements_[open.back()].name != name) {
          return Error(absl::StrCat("</", name, "> closes ",
                                    open.empty()
                                        ? std::string("nothing")
                                        : elements_[open.back()].name));
        }
        open.pop_back();
        continue;
      }
      ++pos_;
      Element e;
      e.name = Name();
      if (e.name.empty()) return Error("'<' that starts no tag");
      if (open.empty() && ++roots > 1) return Error("a second root element");
      while (true) {
        const bool spaced = SkipSpace();
        if (Take('>')) {
          open.push_back(elements_.size());
          break;
        }
        if (doc_.compare(pos_, 2, "/>") == 0) {
          pos_ += 2;
          break;
        }
        if (!spaced) return Error("attributes must be separated by space");
        const std::string attribute = Name();
        if (attribute.empty() || !Take('='))
          return Error("malformed attribute");
        if (pos_ >= doc_.size() || (doc_[pos_] != '"' && doc_[pos_] != '\'')) {
          return Error("unquoted attribute value");
        }
        const char quote = doc_[pos_++];
        std::string value;
        while (pos_ < doc_.size() && doc_[pos_] != quote) {
          if (doc_[pos_] == '<') return Error("'<' in an attribute value");
          if (absl::Status s = CharOrEntity(value); !s.ok()) return s;
        }
        if (!Take(quote)) return Error("unterminated attribute value");
        if (!e.attributes.emplace(attribute, value).second) {
          return Error(absl::StrCat("attribute ", attribute, " twice"));
        }
      }
      elements_.push_back(std::move(e));
    }
    if (!open.empty()) {
      return Error(
          absl::StrCat("<", elements_[open.back()].name, "> is never closed"));
    }
    if (roots != 1) return Error("no root element");
    return elements_;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("offset ", pos_, ": ", what, " near '",
                     doc_.substr(pos_ < 40 ? 0 : pos_ - 40, 80), "'"));
  }
  bool Take(char c) {
    if (pos_ < doc_.size() && doc_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool SkipSpace() {
    const size_t start = pos_;
    while (pos_ < doc_.size() &&
           std::isspace(static_cast<unsigned char>(doc_[pos_]))) {
      ++pos_;
    }
    return pos_ > start;
  }
  std::string Name() {
    const size_t start = pos_;
    while (pos_ < doc_.size() &&
           (std::isalnum(static_cast<unsigned char>(doc_[pos_])) ||
            (pos_ > start && (doc_[pos_] == '-' || doc_[pos_] == '.')) ||
            doc_[pos_] == '_' || doc_[pos_] == ':')) {
      ++pos_;
    }
    return doc_.substr(start, pos_ - start);
  }
  absl::Status CharData(std::string& out) {
    while (pos_ < doc_.size() && doc_[pos_] != '<') {
      if (absl::Status s = CharOrEntity(out); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status CharOrEntity(std::string& out) {
    if (doc_[pos_] != '&') {
      out += doc_[pos_++];
      return absl::OkStatus();
    }
    const size_t end = doc_.find(';', pos_);
    if (end == std::string::npos || end - pos_ > 10) return Error("bare '&'");
    const std::string entity = doc_.substr(pos_ + 1, end - pos_ - 1);
    static const std::map<std::string, char> kEntities = {
        {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    if (const auto it = kEntities.find(entity); it != kEntities.end()) {
      out += it->second;
    } else if (entity.size() > 1 && entity[0] == '#' &&
               entity.find_first_not_of("0123456789", 1) == std::string::npos) {
      out += '?';
    } else {
      return Error(absl::StrCat("unknown entity &", entity, ";"));
    }
    pos_ = end + 1;
    return absl::OkStatus();
  }

  const std::string doc_;
  size_t pos_ = 0;
  std::vector<Element> elements_;
};

std::vector<Element> MustParse(const std::string& doc) {
  absl::StatusOr<std::vector<Element>> elements = XmlChecker(doc).Parse();
  EXPECT_TRUE(elements.ok()) << elements.status();
  return elements.ok() ? *std::move(elements) : std::vector<Element>{};
}

std::vector<const Element*> Named(const std::vector<Element>& elements,
                                  const std::string& name) {
  std::vector<const Element*> out;
  for (const Element& e : elements) {
    if (e.name == name) out.push_back(&e);
  }
  return out;
}

TEST(XmlCheckerTest, RejectsWhatIsNotWellFormed) {
  for (const char* bad : {"<a><b></a></b>", "<a>", "<a></a><b/>", "<a x=1/>",
                          "<a>x & y</a>", "<a>&nbsp;</a>", "<a x=\"<\"/>",
                          "<a x=\"1\"x=\"2\"/>", "text", "<a>1 < 2</a>"}) {
    EXPECT_FALSE(XmlChecker(bad).Parse().ok()) << bad;
  }
  const std::vector<Element> ok =
      MustParse("<!DOCTYPE html>\n<a k='v'><b x=\"&lt;&amp;\"/>t&gt;</a>\n");
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[0].text, "t>");
  EXPECT_EQ(ok[1].attributes.at("x"), "<&");
}

// ---------------------------------------------------------------------------
// The report.

// One tensor at a time that grows by 2 MiB each step: PyTorch's defaults
// cache every old segment, max_split_size_mb lets the allocator free them.
Trace GrowingTensorTrace() {
  TraceBuilder b;
  for (int k = 0; k < 40; ++k) b.Free(b.Alloc((100 + 2 * k) * kMiB));
  return b.Build();
}

TuneOptions Device(uint64_t capacity) {
  TuneOptions options;
  options.capacity = capacity;
  options.total_memory = capacity;
  options.jobs = 2;
  options.budget = 60;
  return options;
}

struct Tuned {
  Trace trace;
  TuneReport report;
  ReportContext context;
  HtmlReport html;
};

Tuned TuneAndDraw(uint64_t capacity,
                  std::string trace_path = "growing.pickle") {
  Tuned t;
  t.trace = GrowingTensorTrace();
  absl::StatusOr<TuneReport> report =
      Tune(t.trace, DefaultSearchSpace(), Device(capacity));
  EXPECT_TRUE(report.ok()) << report.status();
  if (report.ok()) t.report = *std::move(report);
  t.context =
      ReportContext{std::move(trace_path), t.trace.events.size(), 0, 10};
  absl::StatusOr<HtmlReport> html =
      MakeHtmlReport(t.trace, t.report, t.context);
  EXPECT_TRUE(html.ok()) << html.status();
  if (html.ok()) t.html = *std::move(html);
  return t;
}

TEST(HtmlReportTest, EverySvgIsWellFormedWithATitle) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  for (const std::string* svg :
       {&t.html.timeline_svg, &t.html.fragmentation_svg,
        &t.html.landscape_svg}) {
    const std::vector<Element> elements = MustParse(*svg);
    ASSERT_FALSE(elements.empty());
    EXPECT_EQ(elements[0].name, "svg");
    EXPECT_EQ(elements[0].attributes.at("xmlns"), "http://www.w3.org/2000/svg");
    EXPECT_FALSE(Named(elements, "title").empty());
  }
}

TEST(HtmlReportTest, TimelineHasReservedAndAllocatedOfBothConfigs) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  ASSERT_NE(t.report.recommended(), nullptr);
  const std::vector<Element> elements = MustParse(t.html.timeline_svg);
  std::vector<std::string> names;
  for (const Element* p : Named(elements, "polyline")) {
    names.push_back(p->attributes.at("data-series"));
    const std::vector<std::string> points =
        absl::StrSplit(p->attributes.at("points"), ' ');
    // One point per event of this 120-event trace (fewer than 2000).
    EXPECT_EQ(points.size(), t.trace.events.size()) << names.back();
    for (const std::string& point : points) {
      const std::vector<std::string> xy = absl::StrSplit(point, ',');
      ASSERT_EQ(xy.size(), 2u) << point;
      const double x = std::stod(xy[0]), y = std::stod(xy[1]);
      EXPECT_TRUE(x >= 0 && x <= 900 && y >= 0 && y <= 380) << point;
    }
  }
  EXPECT_THAT(names, UnorderedElementsAre(
                         "defaults, reserved", "defaults, allocated",
                         "recommended, reserved", "recommended, allocated"));
  // Size labels on the axis.
  std::vector<std::string> labels;
  for (const Element* text : Named(elements, "text"))
    labels.push_back(text->text);
  EXPECT_THAT(labels, Contains(testing::MatchesRegex("[0-9]+\\.00 [KMG]iB")));
  EXPECT_THAT(labels, Contains("trace event"));
}

TEST(HtmlReportTest, FragmentationHasOneCurvePerConfig) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  const std::vector<Element> elements = MustParse(t.html.fragmentation_svg);
  std::vector<std::string> names;
  for (const Element* p : Named(elements, "polyline")) {
    names.push_back(p->attributes.at("data-series"));
  }
  EXPECT_THAT(names, UnorderedElementsAre("defaults", "recommended"));
}

TEST(HtmlReportTest, LandscapeHasABarPerSettingTried) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  const std::vector<Element> elements = MustParse(t.html.landscape_svg);
  std::vector<std::string> bars;
  for (const Element* rect : Named(elements, "rect")) {
    if (rect->attributes.contains("data-bar")) {
      bars.push_back(rect->attributes.at("data-bar"));
    }
  }
  std::vector<std::string> texts;
  for (const Element* text : Named(elements, "text"))
    texts.push_back(text->text);
  // Each max_split_size_mb and roundup value the search evaluated has a
  // bar, or says that no feasible config had it.
  for (const Evaluation& e : t.report.ranked) {
    const size_t split = e.candidate.config.max_split_size;
    const std::string label =
        split == SIZE_MAX ? "unset" : absl::StrCat(split >> 20, " MiB");
    // The recommended config's values are marked.
    EXPECT_THAT(texts, Contains(testing::AnyOf(label, "\xe2\x96\xb6 " + label)));
  }
  EXPECT_THAT(bars, Contains("unset"));
  EXPECT_THAT(bars, Contains("128 MiB"));
  EXPECT_THAT(texts, Contains(HasSubstr("defaults: ")));
}

TEST(HtmlReportTest, LandscapeMarksTheRecommendedConfig) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  const Evaluation* best = t.report.recommended();
  ASSERT_NE(best, nullptr);
  const std::vector<Element> elements = MustParse(t.html.landscape_svg);
  std::vector<std::string> marked;
  for (const Element* rect : Named(elements, "rect")) {
    if (rect->attributes.contains("data-recommended")) {
      marked.push_back(rect->attributes.at("data-bar"));
    }
  }
  const size_t split = best->candidate.config.max_split_size;
  EXPECT_THAT(marked, UnorderedElementsAre(
                          split == SIZE_MAX ? "unset" : absl::StrCat(split >> 20, " MiB"),
                          RoundupLabel(best->candidate.config.roundup_power2_divisions)));
  std::vector<std::string> texts;
  for (const Element* text : Named(elements, "text")) texts.push_back(text->text);
  EXPECT_THAT(texts, Contains(HasSubstr("recommended: ")));
}

TEST(HtmlReportTest, RecommendationBoxHasSavingsKnobsAndThePush) {
  Tuned t = TuneAndDraw(8 * kGiB);
  const Evaluation* best = t.report.recommended();
  ASSERT_NE(best, nullptr);
  const std::string& html = t.html.index_html;
  const std::vector<Element> elements = MustParse(html);
  std::vector<std::string> paragraphs;
  for (const Element* p : Named(elements, "p")) paragraphs.push_back(p->text);
  EXPECT_THAT(paragraphs, Contains(SavingText(t.report, *best)));
  for (const ConfigKeyExplanation& key :
       CheckAllocatorConfig(CandidateConfString(best->candidate)).keys) {
    EXPECT_THAT(html, HasSubstr(absl::StrCat("<code>", key.key, "</code>")));
  }
  EXPECT_THAT(html, HasSubstr("allocctl config set"));
  // Long lines wrap rather than hide behind a scroll bar.
  EXPECT_THAT(html, HasSubstr("white-space:pre-wrap"));
}

// The extent of `text` drawn at 0.6 em a character (more than sans-serif's
// average): [left, right].
std::pair<double, double> TextExtent(const Element& text) {
  const double size = text.attributes.contains("font-size")
                          ? std::stod(text.attributes.at("font-size"))
                          : 12.0;
  size_t chars = 0;  // code points
  for (const char c : text.text) chars += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  const double width = 0.6 * size * static_cast<double>(chars);
  const double x = std::stod(text.attributes.at("x"));
  const std::string anchor =
      text.attributes.contains("text-anchor") ? text.attributes.at("text-anchor") : "start";
  if (anchor == "middle") return {x - width / 2, x + width / 2};
  if (anchor == "end") return {x - width, x};
  return {x, x + width};
}

TEST(HtmlReportTest, NoTextRunsOffThePicture) {
  Tuned t = TuneAndDraw(8 * kGiB);
  ASSERT_NE(t.report.recommended(), nullptr);
  // The longest config the space can make.
  Evaluation& best = t.report.ranked[t.report.recommended() - t.report.ranked.data()];
  AllocatorConfig& c = best.candidate.config;
  c.max_split_size = 1024 * kMiB;
  c.max_non_split_rounding = 512 * kMiB;
  c.roundup_power2_divisions = {1, 2, 4, 8, 16, 1, 2, 4, 8, 16, 1, 2, 4, 8, 16, 4};
  c.expandable_segments = true;
  c.garbage_collection_threshold = 0.85;
  absl::StatusOr<HtmlReport> html = MakeHtmlReport(t.trace, t.report, t.context);
  ASSERT_TRUE(html.ok()) << html.status();
  for (const std::string* svg :
       {&html->timeline_svg, &html->fragmentation_svg, &html->landscape_svg}) {
    const std::vector<Element> elements = MustParse(*svg);
    const double width = std::stod(elements[0].attributes.at("width"));
    const double height = std::stod(elements[0].attributes.at("height"));
    for (const Element* text : Named(elements, "text")) {
      const auto [left, right] = TextExtent(*text);
      EXPECT_GE(left, 0) << text->text;
      EXPECT_LE(right, width) << text->text;
      const double y = std::stod(text->attributes.at("y"));
      EXPECT_TRUE(y > 0 && y <= height) << text->text;
    }
  }
}

TEST(HtmlReportTest, IndexEmbedsTheSvgsAndTheRecommendation) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  const Evaluation* best = t.report.recommended();
  ASSERT_NE(best, nullptr);
  const std::string& html = t.html.index_html;
  const std::vector<Element> elements = MustParse(html);
  EXPECT_EQ(Named(elements, "svg").size(), 3u);
  EXPECT_THAT(html, HasSubstr(t.html.timeline_svg));
  EXPECT_THAT(html, HasSubstr(t.html.fragmentation_svg));
  EXPECT_THAT(html, HasSubstr(t.html.landscape_svg));
  std::string pasted;
  for (const Element* pre : Named(elements, "pre")) pasted += pre->text;
  for (const std::string& line : RecommendationLines(*best)) {
    EXPECT_THAT(pasted, HasSubstr(line));
  }
  // The text report, table and all.
  std::ostringstream text;
  PrintTextReport(t.report, t.context, text);
  EXPECT_THAT(pasted, HasSubstr(text.str()));
  // Self-contained: no scripts, nothing to fetch.
  EXPECT_TRUE(Named(elements, "script").empty());
  EXPECT_TRUE(Named(elements, "link").empty());
  EXPECT_TRUE(Named(elements, "img").empty());
  size_t at = 0;
  while ((at = html.find("http", at)) != std::string::npos) {
    EXPECT_EQ(html.compare(at, 26, "http://www.w3.org/2000/svg"), 0)
        << html.substr(at, 60);
    ++at;
  }
}

TEST(HtmlReportTest, TextIsEscaped) {
  const std::string path = "runs/<a&b>\"it's\".pickle";
  const Tuned t = TuneAndDraw(8 * kGiB, path);
  const std::vector<Element> elements = MustParse(t.html.index_html);
  ASSERT_FALSE(Named(elements, "title").empty());
  EXPECT_EQ(Named(elements, "title")[0]->text, "allocd tune: " + path);
  EXPECT_THAT(t.html.index_html, Not(HasSubstr("<a&b>")));
}

TEST(HtmlReportTest, WithoutARecommendationOnlyTheDefaultsAreDrawn) {
  // 100 MiB cannot hold the last tensors.
  const Tuned t = TuneAndDraw(100 * kMiB);
  ASSERT_EQ(t.report.recommended(), nullptr);
  const std::vector<Element> elements = MustParse(t.html.timeline_svg);
  std::vector<std::string> names;
  for (const Element* p : Named(elements, "polyline")) {
    names.push_back(p->attributes.at("data-series"));
  }
  EXPECT_THAT(
      names, UnorderedElementsAre("defaults, reserved", "defaults, allocated"));
  EXPECT_THAT(t.html.index_html, HasSubstr("No candidate fits"));
  MustParse(t.html.index_html);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(HtmlReportTest, WritesTheFilesIntoANewDirectory) {
  const Tuned t = TuneAndDraw(8 * kGiB);
  const std::string dir =
      absl::StrCat(testing::TempDir(), "/html_report_", getpid(), "/nested");
  ASSERT_TRUE(WriteHtmlReport(dir, t.html).ok());
  EXPECT_EQ(ReadFile(dir + "/index.html"), t.html.index_html);
  EXPECT_EQ(ReadFile(dir + "/timeline.svg"), t.html.timeline_svg);
  EXPECT_EQ(ReadFile(dir + "/fragmentation.svg"), t.html.fragmentation_svg);
  EXPECT_EQ(ReadFile(dir + "/landscape.svg"), t.html.landscape_svg);
}

TEST(HtmlReportTest, AnUnwritableDirectoryIsAnErrorThatNamesIt) {
  const absl::Status s = WriteHtmlReport("/dev/null/report", HtmlReport{});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("/dev/null/report"));
}

}  // namespace
}  // namespace allocd
