#pragma once
// A small SVG line-plot writer for fidelity sweeps: one polyline (with point markers) per series,
// horizontal reference lines (full KV), axes with "nice" ticks, a title and a legend.
// No dependencies: the file is plain SVG 1.1 text, viewable in any browser.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace origami::eval {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are left out
};

// A horizontal line across the plot at y (e.g. the full-KV accuracy).
struct PlotReference {
  std::string name;
  double y = 0.0;
};

enum class AxisScale { kAuto, kLinear, kLog2 };

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotReference> references;
  // kAuto: log2 when every x is positive and they span a factor of 4 or more (KV budgets are
  // usually powers of two), else linear.
  AxisScale x_scale = AxisScale::kAuto;
  // Fixed y range (e.g. [0, 1] for accuracy); unset: from the data, padded to nice ticks.
  std::optional<double> y_min, y_max;
  int width = 760;
  int height = 460;
};

// "Nice" tick values (steps of 1, 2 or 5 times a power of ten) covering [lo, hi] with about
// `target` ticks; the first tick is <= lo and the last >= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// Escapes &, <, >, " and ' for SVG text and attribute values.
std::string xml_escape(const std::string& text);

std::string render_svg_plot(const PlotSpec& spec);
// Writes render_svg_plot(spec) to `path`; the error names the path.
Status write_svg_plot(const std::string& path, const PlotSpec& spec);

}  // namespace origami::eval
