#include "planner/gantt_svg.hpp"

#include <algorithm>
#include <cmath>

namespace dash {
namespace {

constexpr double kChartWidth = 1200.0;
constexpr double kRowHeight = 14.0;
constexpr double kRowGap = 2.0;
constexpr double kLeftMargin = 70.0;
constexpr double kTopMargin = 48.0;
constexpr double kBottomMargin = 40.0;
constexpr int kAxisTicks = 10;

// Compute segments cycle through a few hues by head so that heads can be told apart.
const char* compute_color(int head) {
  static const char* const kColors[] = {"#4e79a7", "#76b7b2", "#59a14f", "#9c755f", "#b07aa1", "#edc948"};
  return kColors[head % 6];
}

const char* segment_color(const ExpandedSchedule& s, const Segment& seg) {
  switch (seg.kind) {
    case SegmentKind::kWait:
      return "#e15759";
    case SegmentKind::kReduce:
      return "#f28e2b";
    case SegmentKind::kCompute:
      break;
  }
  return compute_color(seg.job >= 0 ? s.jobs[seg.job].job.head : 0);
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

}  // namespace

void write_gantt_svg(const ExpandedSchedule& s, const SimulationResult& result, const GanttOptions& options,
                     std::ostream& out) {
  const int rows = std::min(options.max_ctas, static_cast<int>(result.timeline.size()));
  const double height = kTopMargin + rows * (kRowHeight + kRowGap) + kBottomMargin;
  const double makespan = result.makespan > 0 ? result.makespan : 1.0;
  const double scale = (kChartWidth - kLeftMargin - 10.0) / makespan;

  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kChartWidth << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << kLeftMargin << "\" y=\"16\" font-size=\"14\">" << escape(options.title) << "</text>\n";
  out << "<text x=\"" << kLeftMargin << "\" y=\"32\">makespan " << result.makespan << ", bubble fraction "
      << result.bubble_fraction << "; compute (colour by head), <tspan fill=\"#f28e2b\">reduce</tspan>, "
      << "<tspan fill=\"#e15759\">wait</tspan></text>\n";
  for (int cta = 0; cta < rows; ++cta) {
    const double y = kTopMargin + cta * (kRowHeight + kRowGap);
    out << "<text x=\"4\" y=\"" << y + kRowHeight - 3 << "\">CTA " << cta << "</text>\n";
    for (const Segment& seg : result.timeline[cta]) {
      const double w = std::max(0.5, (seg.end - seg.start) * scale);
      out << "<rect x=\"" << kLeftMargin + seg.start * scale << "\" y=\"" << y << "\" width=\"" << w << "\" height=\""
          << kRowHeight << "\" fill=\"" << segment_color(s, seg) << "\"/>\n";
    }
  }
  const double axis_y = kTopMargin + rows * (kRowHeight + kRowGap) + 4;
  out << "<line x1=\"" << kLeftMargin << "\" y1=\"" << axis_y << "\" x2=\"" << kLeftMargin + makespan * scale
      << "\" y2=\"" << axis_y << "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= kAxisTicks; ++i) {
    const double t = makespan * i / kAxisTicks;
    out << "<text x=\"" << kLeftMargin + t * scale - 8 << "\" y=\"" << axis_y + 14 << "\">" << std::round(t * 100) / 100
        << "</text>\n";
  }
  if (rows < static_cast<int>(result.timeline.size())) {
    out << "<text x=\"" << kLeftMargin << "\" y=\"" << axis_y + 30 << "\">(" << result.timeline.size() - rows
        << " more CTAs not drawn)</text>\n";
  }
  out << "</svg>\n";
}

}  // namespace dash
