#include "tuner/html_report.h"

#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "allocator/bytes.h"
#include "allocator/config_check.h"
#include "allocator/trace/replay.h"
#include "tuner/evaluator.h"
#include "tuner/search_space.h"

namespace allocd {
namespace {

constexpr size_t kTimelineSamples = 2000;
constexpr const char* kDefaultColor = "#4e79a7";
constexpr const char* kRecommendedColor = "#f28e2c";
constexpr const char* kGridColor = "#dddddd";
constexpr const char* kMutedColor = "#777777";
constexpr const char* kMarkColor = "#c0392b";

// Text for XML content and attribute values. Control characters XML 1.0
// forbids become U+FFFD.
std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' &&
            c != '\r') {
          out += "\xef\xbf\xbd";
        } else {
          out += c;
        }
    }
  }
  return out;
}

// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
double NiceStep(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

// A step that splits [0, max] into about `ticks` steps.
double CountStep(double max, int ticks) {
  return NiceStep(std::max(max / ticks, 1.0));
}

// The same for byte counts, a nice number of KiB, MiB, GiB or TiB, so that
// FormatSize labels read "2.00 GiB" rather than "1.86 GiB".
double SizeStep(double max, int ticks) {
  const double raw = std::max(max / ticks, 1.0);
  double unit = 1;
  while (unit * 1024 <= raw && unit < 0x1p40) unit *= 1024;
  return NiceStep(raw / unit) * unit;
}

// "950", "12.5k", "1.2M": axis labels for event counts.
std::string CountLabel(double count) {
  if (count >= 1e6) return absl::StrFormat("%gM", count / 1e6);
  if (count >= 1e3) return absl::StrFormat("%gk", count / 1e3);
  return absl::StrFormat("%g", count);
}

std::string SvgOpen(int width, int height, absl::string_view title) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\" "
      "role=\"img\">\n<title>%s</title>\n"
      "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"15\" "
      "font-weight=\"bold\">%s</text>\n",
      width, height, width, height, XmlEscape(title), width, height,
      XmlEscape(title));
}

std::string Text(double x, double y, absl::string_view text,
                 absl::string_view attributes = "") {
  return absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\"%s%s>%s</text>\n", x, y,
                         attributes.empty() ? "" : " ", attributes,
                         XmlEscape(text));
}

std::string Line(double x1, double y1, double x2, double y2,
                 absl::string_view attributes) {
  return absl::StrFormat(
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s/>\n", x1, y1,
      x2, y2, attributes);
}

// What a line of `chars` characters spans at `font_size` px: 0.6 em a
// character, more than sans-serif's average, so that labels placed by it
// stay inside the picture.
double TextWidth(size_t chars, double font_size = 12) {
  return 0.6 * font_size * static_cast<double>(chars);
}

// `text` broken at spaces into lines of at most `max_chars` characters (a
// word longer than that gets a line of its own, broken after commas).
std::vector<std::string> WrapText(absl::string_view text, size_t max_chars) {
  // Each piece with what joins it to the one before: a space between
  // words, nothing inside a word broken after a comma.
  std::vector<std::pair<std::string, const char*>> pieces;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    const char* glue = " ";
    while (word.size() > max_chars) {
      size_t cut = word.substr(0, max_chars).rfind(',');
      cut = cut == absl::string_view::npos ? max_chars : cut + 1;
      pieces.emplace_back(std::string(word.substr(0, cut)), glue);
      glue = "";
      word.remove_prefix(cut);
    }
    if (!word.empty()) pieces.emplace_back(std::string(word), glue);
  }
  std::vector<std::string> lines;
  for (const auto& [piece, glue] : pieces) {
    if (!lines.empty() &&
        lines.back().size() + std::strlen(glue) + piece.size() <= max_chars) {
      absl::StrAppend(&lines.back(), glue, piece);
    } else {
      lines.push_back(piece);
    }
  }
  if (lines.empty()) lines.emplace_back();
  return lines;
}

// A muted subtitle from y = 38 down, wrapped to the picture's width; adds
// to `svg` and returns how many lines it took.
int Subtitle(std::string& svg, int width, absl::string_view text) {
  const auto max_chars = static_cast<size_t>((width - 20) / TextWidth(1));
  const std::vector<std::string> lines = WrapText(text, max_chars);
  for (size_t i = 0; i < lines.size(); ++i) {
    svg += Text(10, 38 + 15.0 * static_cast<double>(i), lines[i],
                absl::StrFormat("fill=\"%s\"", kMutedColor));
  }
  return static_cast<int>(lines.size());
}

// One curve of a line chart: (event, bytes) points.
struct Series {
  std::string name;
  const char* color;
  bool dashed;
  std::vector<std::pair<double, double>> points;
};

std::string Stroke(const char* color, bool dashed) {
  return absl::StrCat("stroke=\"", color, "\" stroke-width=\"1.5\"",
                      dashed ? " stroke-dasharray=\"6 3\"" : "");
}

// Bytes over trace events, one polyline per series, with a legend.
std::string LineChart(absl::string_view title, absl::string_view subtitle,
                      double events, const std::vector<Series>& series) {
  constexpr int kWidth = 900, kPlotHeight = 265;
  constexpr double kLeft = 90, kRight = 20, kBottom = 45;
  constexpr double kPlotWidth = kWidth - kLeft - kRight;
  // The subtitle can take several lines; the legend and plot go below it.
  std::string subtitle_svg;
  const int subtitle_lines = Subtitle(subtitle_svg, kWidth, subtitle);
  const double extra = 15.0 * (subtitle_lines - 1);
  const double kTop = 70 + extra;
  const double legend_y = 56 + extra;
  const int kHeight = static_cast<int>(kTop + kPlotHeight + kBottom);

  double max_bytes = 0;
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) max_bytes = std::max(max_bytes, y);
  }
  const double y_step = SizeStep(max_bytes, 5);
  const double y_top = std::max(1.0, std::ceil(max_bytes / y_step)) * y_step;
  const double x_top = std::max(events, 1.0);
  const double x_step = CountStep(x_top, 8);
  const auto px = [&](double x) { return kLeft + kPlotWidth * x / x_top; };
  const auto py = [&](double y) {
    return kTop + kPlotHeight * (1 - y / y_top);
  };

  std::string svg = SvgOpen(kWidth, kHeight, title) + subtitle_svg;
  for (int i = 0; i * y_step <= y_top; ++i) {
    const double y = py(i * y_step);
    svg += Line(kLeft, y, kLeft + kPlotWidth, y,
                absl::StrFormat("stroke=\"%s\"", kGridColor));
    svg += Text(kLeft - 6, y + 4, FormatSize(static_cast<uint64_t>(i * y_step)),
                "text-anchor=\"end\"");
  }
  for (int i = 0; i * x_step <= x_top; ++i) {
    const double x = px(i * x_step);
    svg += Line(x, kTop + kPlotHeight, x, kTop + kPlotHeight + 5,
                "stroke=\"black\"");
    svg += Text(x, kTop + kPlotHeight + 18, CountLabel(i * x_step),
                "text-anchor=\"middle\"");
  }
  svg += Line(kLeft, kTop, kLeft, kTop + kPlotHeight, "stroke=\"black\"");
  svg += Line(kLeft, kTop + kPlotHeight, kLeft + kPlotWidth, kTop + kPlotHeight,
              "stroke=\"black\"");
  svg += Text(kLeft + kPlotWidth / 2, kHeight - 8, "trace event",
              "text-anchor=\"middle\"");

  double legend_x = kLeft;
  for (const Series& s : series) {
    std::string points;
    for (const auto& [x, y] : s.points) {
      absl::StrAppendFormat(&points, "%s%.1f,%.1f", points.empty() ? "" : " ",
                            px(x), py(y));
    }
    svg += absl::StrFormat(
        "<polyline data-series=\"%s\" fill=\"none\" %s points=\"%s\">"
        "<title>%s</title></polyline>\n",
        XmlEscape(s.name), Stroke(s.color, s.dashed), points,
        XmlEscape(s.name));
    svg += Line(legend_x, legend_y, legend_x + 24, legend_y, Stroke(s.color, s.dashed));
    svg += Text(legend_x + 30, legend_y + 4, s.name);
    legend_x += 50 + TextWidth(s.name.size());
  }
  return svg + "</svg>\n";
}

// One horizontal bar per value of a search dimension.
struct Bar {
  std::string label;
  std::optional<int64_t> bytes;  // nullopt: no feasible config had it
  bool recommended = false;      // the recommended config has this value
};
// A dashed vertical line across every panel at `bytes`, labelled.
struct ReferenceLine {
  int64_t bytes;
  std::string label;
  const char* color;
};
struct BarPanel {
  std::string title;
  std::vector<Bar> bars;
};

// Panels of horizontal bars on one byte scale, with a dashed line at each
// reference. Bars of the recommended config's values are outlined and their
// labels marked.
std::string BarChart(absl::string_view title, absl::string_view subtitle,
                     const std::vector<BarPanel>& panels,
                     const std::vector<ReferenceLine>& references) {
  constexpr int kWidth = 900;
  constexpr double kRight = 110, kBarHeight = 16, kPitch = 22;
  constexpr absl::string_view kMark = "\xe2\x96\xb6 ";  // "▶ "
  size_t longest_label = 0;
  size_t bars = 0;
  int64_t max_bytes = 0;
  for (const ReferenceLine& r : references) max_bytes = std::max(max_bytes, r.bytes);
  for (const BarPanel& panel : panels) {
    for (const Bar& bar : panel.bars) {
      longest_label = std::max(longest_label, bar.label.size() + 2);
      if (bar.bytes) max_bytes = std::max(max_bytes, *bar.bytes);
      ++bars;
    }
  }
  const double left = std::clamp(20 + TextWidth(longest_label), 100.0, 600.0);
  const double plot_width = kWidth - left - kRight;
  const double x_step = SizeStep(static_cast<double>(max_bytes), 5);
  const double x_top =
      std::max(1.0, std::ceil(static_cast<double>(max_bytes) / x_step)) *
      x_step;
  const auto px = [&](double bytes) {
    return left + plot_width * bytes / x_top;
  };

  std::string svg;
  const int subtitle_lines = Subtitle(svg, kWidth, subtitle);
  const double panel_head = 40 + 14.0 * static_cast<double>(references.size());
  const int height = static_cast<int>(
      50 + 15 * (subtitle_lines - 1) +
      static_cast<double>(panels.size()) * (panel_head + 50) +
      static_cast<double>(bars) * kPitch);
  svg = SvgOpen(kWidth, height, title) + svg;
  double y = 50 + 15.0 * (subtitle_lines - 1);
  for (const BarPanel& panel : panels) {
    svg += Text(10, y + 20, panel.title, "font-weight=\"bold\"");
    const double top = y + panel_head;
    const double bottom = top + static_cast<double>(panel.bars.size()) * kPitch;
    for (int i = 0; i * x_step <= x_top; ++i) {
      const double x = px(i * x_step);
      svg +=
          Line(x, top, x, bottom, absl::StrFormat("stroke=\"%s\"", kGridColor));
      svg += Text(x, bottom + 16, FormatSize(static_cast<uint64_t>(i * x_step)),
                  "text-anchor=\"middle\"");
    }
    double bar_y = top + (kPitch - kBarHeight) / 2;
    for (const Bar& bar : panel.bars) {
      svg += Text(left - 8, bar_y + 12,
                  bar.recommended ? absl::StrCat(kMark, bar.label) : bar.label,
                  bar.recommended ? "text-anchor=\"end\" font-weight=\"bold\""
                                  : "text-anchor=\"end\"");
      if (bar.bytes) {
        const std::string size = FormatSize(static_cast<uint64_t>(*bar.bytes));
        const double bar_end = px(static_cast<double>(*bar.bytes));
        svg += absl::StrFormat(
            "<rect data-bar=\"%s\"%s x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\" fill=\"%s\"%s><title>%s: %s%s</title></rect>\n",
            XmlEscape(bar.label), bar.recommended ? " data-recommended=\"true\"" : "",
            left, bar_y, bar_end - left, kBarHeight, kRecommendedColor,
            bar.recommended ? " stroke=\"black\" stroke-width=\"2\"" : "",
            XmlEscape(bar.label), size,
            bar.recommended ? " (the recommended config's value)" : "");
        svg += Text(bar_end + 6, bar_y + 12, size);
      } else {
        svg += Text(left + 6, bar_y + 12, "no feasible config",
                    absl::StrFormat("fill=\"%s\"", kMutedColor));
      }
      bar_y += kPitch;
    }
    // Each reference on its own row above the bars; its label on the side
    // of the line where it fits.
    for (size_t r = 0; r < references.size(); ++r) {
      const ReferenceLine& ref = references[r];
      const double rx = px(static_cast<double>(ref.bytes));
      const double label_y = top - 6 - 14.0 * static_cast<double>(references.size() - 1 - r);
      svg += Line(rx, label_y + 2, rx, bottom,
                  absl::StrFormat("stroke=\"%s\" stroke-width=\"1.5\" "
                                  "stroke-dasharray=\"5 3\"",
                                  ref.color));
      const bool fits_right = rx + 4 + TextWidth(ref.label.size()) <= kWidth - 5;
      svg += Text(fits_right ? rx + 4 : rx - 4, label_y, ref.label,
                  absl::StrFormat("fill=\"%s\"%s", ref.color,
                                  fits_right ? "" : " text-anchor=\"end\""));
    }
    y = bottom + 50;
  }
  return svg + "</svg>\n";
}

// The least peak reserved memory of the feasible evaluations, per key.
template <typename Key, typename KeyOf, typename LabelOf>
BarPanel LandscapePanel(const TuneReport& report, std::string title,
                        KeyOf key_of, LabelOf label_of) {
  const Evaluation* recommended = report.recommended();
  std::map<Key, std::optional<int64_t>> best;
  for (const Evaluation& e : report.ranked) {
    std::optional<int64_t>& bytes = best[key_of(e)];
    if (report.Feasible(e) && (!bytes || e.replay.peak_reserved < *bytes)) {
      bytes = e.replay.peak_reserved;
    }
  }
  BarPanel panel{std::move(title), {}};
  for (const auto& [key, bytes] : best) {
    panel.bars.push_back({label_of(key), bytes,
                          recommended != nullptr && key_of(*recommended) == key});
  }
  return panel;
}

std::string ConfigName(const Candidate& candidate) {
  std::string conf = CandidateConfString(candidate);
  if (conf.empty()) conf = "PyTorch's defaults";
  if (candidate.memory_fraction) {
    absl::StrAppendFormat(&conf, " + memory fraction %g",
                          *candidate.memory_fraction);
  }
  return conf;
}

std::string LandscapeSvg(const TuneReport& report) {
  // Unset sorts first: std::nullopt and all-zero divisions are least.
  BarPanel max_split = LandscapePanel<std::optional<size_t>>(
      report, "per max_split_size_mb",
      [](const Evaluation& e) -> std::optional<size_t> {
        const size_t bytes = e.candidate.config.max_split_size;
        if (bytes == std::numeric_limits<size_t>::max()) return std::nullopt;
        return bytes;
      },
      [](const std::optional<size_t>& bytes) {
        return bytes ? absl::StrCat(*bytes >> 20, " MiB") : "unset";
      });
  BarPanel roundup = LandscapePanel<RoundupDivisions>(
      report, "per roundup_power2_divisions",
      [](const Evaluation& e) {
        return e.candidate.config.roundup_power2_divisions;
      },
      [](const RoundupDivisions& divisions) {
        return RoundupLabel(divisions);
      });
  std::vector<ReferenceLine> references = {
      {report.baseline.replay.peak_reserved,
       absl::StrCat("defaults: ", FormatSize(static_cast<uint64_t>(
                                      report.baseline.replay.peak_reserved))),
       kDefaultColor}};
  std::string subtitle = absl::StrFormat(
      "the best feasible config the search tried with each value (%d configs "
      "evaluated)",
      report.evaluations);
  if (const Evaluation* best = report.recommended()) {
    references.push_back(
        {best->replay.peak_reserved,
         absl::StrCat("recommended: ", FormatSize(static_cast<uint64_t>(
                                           best->replay.peak_reserved))),
         kMarkColor});
    absl::StrAppend(&subtitle, "; \xe2\x96\xb6 marks the values of the recommended config (",
                    ConfigName(best->candidate), ")");
  }
  return BarChart("Search landscape: least peak reserved memory per setting",
                  subtitle, {max_split, roundup}, references);
}

absl::StatusOr<ReplayResult> ReplayTimeline(const Trace& trace,
                                            const TuneReport& report,
                                            const Candidate& candidate) {
  ReplayOptions options = CandidateReplayOptions(
      candidate,
      EvaluatorOptions{.capacity = report.options.capacity,
                       .total_memory = report.options.total_memory},
      report.options.capacity);
  options.timeline_samples = kTimelineSamples;
  return Replay(trace, candidate.config, options);
}

// What one config's replay contributes to the two line charts.
struct Curves {
  Series reserved;
  Series allocated;
  Series fragmentation;
};

Curves CurvesOf(const ReplayResult& replay, absl::string_view name,
                const char* color) {
  Curves c{{absl::StrCat(name, ", reserved"), color, false, {}},
           {absl::StrCat(name, ", allocated"), color, true, {}},
           {std::string(name), color, false, {}}};
  for (const TimelineSample& s : replay.timeline) {
    const auto event = static_cast<double>(s.event);
    c.reserved.points.emplace_back(event, static_cast<double>(s.reserved));
    c.allocated.points.emplace_back(event, static_cast<double>(s.allocated));
    c.fragmentation.points.emplace_back(
        event,
        static_cast<double>(std::max<int64_t>(0, s.reserved - s.allocated)));
  }
  return c;
}

// The knobs `e` sets, with their values and what each does; the memory
// fraction last.
std::string KnobsTable(const Evaluation& e) {
  const ConfigCheck check = CheckAllocatorConfig(CandidateConfString(e.candidate));
  std::string rows;
  for (const ConfigKeyExplanation& key : check.keys) {
    rows += absl::StrCat("<tr><td><code>", XmlEscape(key.key), "</code></td><td><code>",
                         XmlEscape(key.value), "</code></td><td>",
                         XmlEscape(key.explanation), "</td></tr>\n");
  }
  if (e.candidate.memory_fraction) {
    rows += absl::StrFormat(
        "<tr><td><code>set_per_process_memory_fraction</code></td><td><code>%g"
        "</code></td><td>caps the process's reserved memory at this share of "
        "the device; only under it does garbage_collection_threshold act</td></tr>\n",
        *e.candidate.memory_fraction);
  }
  if (rows.empty()) return "<p>It sets no knob: PyTorch's defaults.</p>\n";
  return absl::StrCat(
      "<table class=\"knobs\">\n<tr><th>knob</th><th>value</th><th>what it does</th>"
      "</tr>\n",
      rows, "</table>\n");
}

constexpr absl::string_view kStyle =
    "body{font-family:sans-serif;max-width:940px;margin:2em auto;"
    "padding:0 1em;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}"
    "pre{background:#f5f5f5;padding:.8em;font-size:12px;"
    "white-space:pre-wrap;overflow-wrap:anywhere}"
    "pre.paste{font-size:14px;border-left:4px solid #f28e2c}"
    ".box{border:1px solid #f28e2c;padding:0 1em;margin:1em 0}"
    ".saving{font-weight:bold}"
    "table{border-collapse:collapse;margin:.5em 0;font-size:13px}"
    "td,th{border:1px solid #ddd;padding:.3em .5em;text-align:left;"
    "vertical-align:top;overflow-wrap:anywhere}"
    "tr.recommended{background:#fdf0e2}"
    "figure{margin:1em 0}figure svg{max-width:100%;height:auto}"
    ".meta{color:#555}";

std::string IndexHtml(const TuneReport& report, const ReportContext& context,
                      const HtmlReport& files) {
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<title>allocd tune: ",
      XmlEscape(context.trace_path), "</title>\n<style>", kStyle,
      "</style>\n</head>\n<body>\n<h1>allocd tune report</h1>\n");
  absl::StrAppendFormat(
      &html,
      "<p class=\"meta\">%s: device %d, %d events; objective %s; capacity "
      "%s</p>\n",
      XmlEscape(context.trace_path), context.device, context.trace_events,
      ObjectiveName(report.objective),
      report.options.capacity == 0 ? "unlimited"
                                   : FormatSize(report.options.capacity));

  html += "<h2>Recommendation</h2>\n";
  if (const Evaluation* best = report.recommended()) {
    html += "<div class=\"box\">\n<pre class=\"paste\">";
    for (const std::string& line : RecommendationLines(*best)) {
      html += XmlEscape(line) + "\n";
    }
    html += "</pre>\n";
    html += absl::StrCat("<p class=\"saving\">", XmlEscape(SavingText(report, *best)),
                         "</p>\n");
    html += KnobsTable(*best);
    const Evaluation* robust = report.robust();
    const Evaluation* capped = report.capped();
    if (robust != nullptr && capped != nullptr) {
      html += absl::StrFormat(
          "<p>Two answers: the cap saves %.1f%% more than the robust answer; "
          "a cap is recommended only from %g%% (--cap-threshold).</p>\n"
          "<table class=\"answers\">\n<tr><th>answer</th><th>config</th>"
          "<th>saving</th><th>risk</th></tr>\n",
          100.0 * report.CapGain(), 100.0 * report.options.cap_threshold);
      for (const Evaluation* answer : {robust, capped}) {
        html += absl::StrCat(
            "<tr", answer == best ? " class=\"recommended\"" : "", "><td>",
            answer == robust ? "robust (no hard cap)" : "most saving (hard cap)",
            answer == best ? ", recommended" : "", "</td><td><code>",
            XmlEscape(ConfigName(answer->candidate)), "</code></td><td>",
            XmlEscape(SavingText(report, *answer)), "</td><td>",
            XmlEscape(Risk(report, *answer)), "</td></tr>\n");
      }
      html += "</table>\n";
    }
    const std::vector<std::string> warnings = Warnings(report, *best);
    if (!warnings.empty()) {
      html += "<p>Before you paste it:</p>\n<ul>\n";
      for (const std::string& w : warnings) {
        html += absl::StrCat("<li>", XmlEscape(w), "</li>\n");
      }
      html += "</ul>\n";
    }
    html += absl::StrCat("<pre class=\"paste\">", XmlEscape(AllocctlAdvice(report)),
                         "</pre>\n</div>\n");
  } else {
    html += "<p>No candidate fits: see the table below.</p>\n";
  }

  html += absl::StrCat("<h2>Memory over time</h2>\n<figure>\n",
                       files.timeline_svg, "</figure>\n");
  html += absl::StrCat("<h2>Fragmentation</h2>\n<figure>\n",
                       files.fragmentation_svg, "</figure>\n");
  html += absl::StrCat("<h2>Search landscape</h2>\n<figure>\n",
                       files.landscape_svg, "</figure>\n");

  std::ostringstream text;
  PrintTextReport(report, context, text);
  html += absl::StrCat("<h2>All results</h2>\n<pre>", XmlEscape(text.str()),
                       "</pre>\n</body>\n</html>\n");
  return html;
}

absl::Status WriteFile(const std::filesystem::path& path,
                       absl::string_view content) {
  std::ofstream out(path, std::ios::binary);
  if (out)
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot write ", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HtmlReport> MakeHtmlReport(const Trace& trace,
                                          const TuneReport& report,
                                          const ReportContext& context) {
  absl::StatusOr<ReplayResult> defaults =
      ReplayTimeline(trace, report, report.baseline.candidate);
  if (!defaults.ok()) return defaults.status();
  const Curves default_curves = CurvesOf(*defaults, "defaults", kDefaultColor);
  std::vector<Series> timeline = {default_curves.reserved,
                                  default_curves.allocated};
  std::vector<Series> fragmentation = {default_curves.fragmentation};
  std::string subtitle = "no recommended config: PyTorch's defaults only";
  if (const Evaluation* best = report.recommended()) {
    absl::StatusOr<ReplayResult> recommended =
        ReplayTimeline(trace, report, best->candidate);
    if (!recommended.ok()) return recommended.status();
    const Curves curves =
        CurvesOf(*recommended, "recommended", kRecommendedColor);
    timeline.push_back(curves.reserved);
    timeline.push_back(curves.allocated);
    fragmentation.push_back(curves.fragmentation);
    subtitle = absl::StrCat("recommended: ", ConfigName(best->candidate));
  }
  absl::StrAppend(&subtitle, "; capacity ",
                  report.options.capacity == 0
                      ? "unlimited"
                      : FormatSize(report.options.capacity));

  const auto events = static_cast<double>(trace.events.size());
  HtmlReport files;
  files.timeline_svg =
      LineChart("Reserved and allocated memory", subtitle, events, timeline);
  files.fragmentation_svg =
      LineChart("Fragmentation: reserved minus allocated memory", subtitle,
                events, fragmentation);
  files.landscape_svg = LandscapeSvg(report);
  files.index_html = IndexHtml(report, context, files);
  return files;
}

absl::Status PrepareReportDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write into ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteHtmlReport(const std::string& dir, const HtmlReport& report) {
  if (absl::Status s = PrepareReportDir(dir); !s.ok()) return s;
  const std::filesystem::path base(dir);
  for (const auto& [name, content] :
       {std::pair<const char*, const std::string&>{"index.html",
                                                   report.index_html},
        {"timeline.svg", report.timeline_svg},
        {"fragmentation.svg", report.fragmentation_svg},
        {"landscape.svg", report.landscape_svg}}) {
    if (absl::Status s = WriteFile(base / name, content); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace allocd
