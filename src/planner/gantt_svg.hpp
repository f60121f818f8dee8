// Draws a simulated schedule as an SVG Gantt chart: one row per CTA, compute / wait / reduce segments.
#pragma once

#include <ostream>
#include <string>

#include "planner/expanded_schedule.hpp"
#include "planner/simulator.hpp"

namespace dash {

struct GanttOptions {
  std::string title;
  int max_ctas = 64;  // rows drawn; the chart says how many were left out
};

// `result` must come from simulate(..., record_timeline = true).
void write_gantt_svg(const ExpandedSchedule& schedule, const SimulationResult& result, const GanttOptions& options,
                     std::ostream& out);

}  // namespace dash
