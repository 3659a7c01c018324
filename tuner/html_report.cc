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
#include "absl/strings/string_view.h"
#include "allocator/bytes.h"
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
  constexpr int kWidth = 900, kHeight = 380;
  constexpr double kLeft = 90, kRight = 20, kTop = 70, kBottom = 45;
  constexpr double kPlotWidth = kWidth - kLeft - kRight;
  constexpr double kPlotHeight = kHeight - kTop - kBottom;

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

  std::string svg = SvgOpen(kWidth, kHeight, title);
  svg += Text(10, 38, subtitle, absl::StrFormat("fill=\"%s\"", kMutedColor));
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
    svg += Line(legend_x, 56, legend_x + 24, 56, Stroke(s.color, s.dashed));
    svg += Text(legend_x + 30, 60, s.name);
    legend_x += 60 + 7 * static_cast<double>(s.name.size());
  }
  return svg + "</svg>\n";
}

// One horizontal bar per value of a search dimension.
struct Bar {
  std::string label;
  std::optional<int64_t> bytes;  // nullopt: no feasible config had it
};
struct BarPanel {
  std::string title;
  std::vector<Bar> bars;
};

// Panels of horizontal bars on one byte scale, with a dashed line at
// `reference` bytes.
std::string BarChart(absl::string_view title, absl::string_view subtitle,
                     const std::vector<BarPanel>& panels, int64_t reference,
                     absl::string_view reference_label) {
  constexpr int kWidth = 900;
  constexpr double kRight = 110, kBarHeight = 16, kPitch = 22;
  size_t longest_label = 0;
  size_t bars = 0;
  int64_t max_bytes = reference;
  for (const BarPanel& panel : panels) {
    for (const Bar& bar : panel.bars) {
      longest_label = std::max(longest_label, bar.label.size());
      if (bar.bytes) max_bytes = std::max(max_bytes, *bar.bytes);
      ++bars;
    }
  }
  const double left =
      std::clamp(20 + 7 * static_cast<double>(longest_label), 100.0, 380.0);
  const double plot_width = kWidth - left - kRight;
  const double x_step = SizeStep(static_cast<double>(max_bytes), 5);
  const double x_top =
      std::max(1.0, std::ceil(static_cast<double>(max_bytes) / x_step)) *
      x_step;
  const auto px = [&](double bytes) {
    return left + plot_width * bytes / x_top;
  };
  const int height = static_cast<int>(50 + panels.size() * 80 + bars * kPitch);

  std::string svg = SvgOpen(kWidth, height, title);
  svg += Text(10, 38, subtitle, absl::StrFormat("fill=\"%s\"", kMutedColor));
  double y = 50;
  for (const BarPanel& panel : panels) {
    svg += Text(10, y + 20, panel.title, "font-weight=\"bold\"");
    const double top = y + 30;
    const double bottom = top + panel.bars.size() * kPitch;
    for (int i = 0; i * x_step <= x_top; ++i) {
      const double x = px(i * x_step);
      svg +=
          Line(x, top, x, bottom, absl::StrFormat("stroke=\"%s\"", kGridColor));
      svg += Text(x, bottom + 16, FormatSize(static_cast<uint64_t>(i * x_step)),
                  "text-anchor=\"middle\"");
    }
    double bar_y = top + (kPitch - kBarHeight) / 2;
    for (const Bar& bar : panel.bars) {
      svg += Text(left - 8, bar_y + 12, bar.label, "text-anchor=\"end\"");
      if (bar.bytes) {
        const std::string size = FormatSize(static_cast<uint64_t>(*bar.bytes));
        const double bar_end = px(static_cast<double>(*bar.bytes));
        svg += absl::StrFormat(
            "<rect data-bar=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\" fill=\"%s\"><title>%s: %s</title></rect>\n",
            XmlEscape(bar.label), left, bar_y, bar_end - left, kBarHeight,
            kRecommendedColor, XmlEscape(bar.label), size);
        svg += Text(bar_end + 6, bar_y + 12, size);
      } else {
        svg += Text(left + 6, bar_y + 12, "no feasible config",
                    absl::StrFormat("fill=\"%s\"", kMutedColor));
      }
      bar_y += kPitch;
    }
    const double rx = px(static_cast<double>(reference));
    svg += Line(rx, top - 4, rx, bottom,
                absl::StrFormat("stroke=\"%s\" stroke-width=\"1.5\" "
                                "stroke-dasharray=\"5 3\"",
                                kDefaultColor));
    svg += Text(rx + 4, top - 6, reference_label,
                absl::StrFormat("fill=\"%s\"", kDefaultColor));
    y = bottom + 50;
  }
  return svg + "</svg>\n";
}

// The least peak reserved memory of the feasible evaluations, per key.
template <typename Key, typename KeyOf, typename LabelOf>
BarPanel LandscapePanel(const TuneReport& report, std::string title,
                        KeyOf key_of, LabelOf label_of) {
  std::map<Key, std::optional<int64_t>> best;
  for (const Evaluation& e : report.ranked) {
    std::optional<int64_t>& bytes = best[key_of(e)];
    if (report.Feasible(e) && (!bytes || e.replay.peak_reserved < *bytes)) {
      bytes = e.replay.peak_reserved;
    }
  }
  BarPanel panel{std::move(title), {}};
  for (const auto& [key, bytes] : best) {
    panel.bars.push_back({label_of(key), bytes});
  }
  return panel;
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
  return BarChart(
      "Search landscape: least peak reserved memory per setting",
      absl::StrFormat("the best feasible config the search tried with each "
                      "value (%d configs evaluated)",
                      report.evaluations),
      {max_split, roundup}, report.baseline.replay.peak_reserved,
      absl::StrCat("defaults: ", FormatSize(static_cast<uint64_t>(
                                     report.baseline.replay.peak_reserved))));
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

std::string ConfigName(const Candidate& candidate) {
  std::string conf = CandidateConfString(candidate);
  if (conf.empty()) conf = "PyTorch's defaults";
  if (candidate.memory_fraction) {
    absl::StrAppendFormat(&conf, " + memory fraction %g",
                          *candidate.memory_fraction);
  }
  return conf;
}

constexpr absl::string_view kStyle =
    "body{font-family:sans-serif;max-width:940px;margin:2em auto;"
    "padding:0 1em;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}"
    "pre{background:#f5f5f5;padding:.8em;overflow-x:auto;font-size:12px}"
    "pre.paste{font-size:14px;border-left:4px solid #f28e2c}"
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
    html += "<pre class=\"paste\">";
    for (const std::string& line : RecommendationLines(*best)) {
      html += XmlEscape(line) + "\n";
    }
    html += "</pre>\n";
    const std::vector<std::string> warnings = Warnings(report, *best);
    if (!warnings.empty()) {
      html += "<p>Before you paste it:</p>\n<ul>\n";
      for (const std::string& w : warnings) {
        html += absl::StrCat("<li>", XmlEscape(w), "</li>\n");
      }
      html += "</ul>\n";
    }
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
