#include "eval/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace origami::eval {
namespace {

// Tableau-10: distinct, colour-blind-friendlier than a rainbow.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kNumColors = sizeof(kColors) / sizeof(kColors[0]);
constexpr const char* kReferenceColors[] = {"#000000", "#555555", "#999999"};

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}
std::string coord(double v) { return fmt("%.2f", v); }

// Tick labels: integers without decimals, others with as few digits as show the step.
std::string tick_label(double v, double step) {
  if (std::abs(v) < 1e-12 * std::max(1.0, std::abs(step))) v = 0.0;  // no "-0" or "1e-17"
  if (std::abs(v - std::round(v)) < 1e-9 && std::abs(v) < 1e15) return fmt("%.0f", v);
  int decimals = step > 0 ? std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9))) : 3;
  decimals = std::min(decimals, 8);
  char format[16];
  std::snprintf(format, sizeof format, "%%.%df", decimals);
  return fmt(format, v);
}

// An axis: maps data values to [0, 1] (then to pixels by the caller) and lists its ticks.
struct Axis {
  bool log2 = false;
  double lo = 0.0, hi = 1.0;  // in data units (log2 units when log2)
  std::vector<double> ticks;  // in data units
  double step = 1.0;          // linear tick step, for labels

  double unit(double v) const {
    const double t = log2 ? std::log2(v) : v;
    return hi > lo ? (t - lo) / (hi - lo) : 0.5;
  }
};

void widen_if_flat(double* lo, double* hi) {
  if (*hi > *lo) return;
  const double pad = *lo == 0.0 ? 1.0 : std::abs(*lo) * 0.1;
  *lo -= pad;
  *hi += pad;
}

Axis linear_axis(double lo, double hi, std::optional<double> fixed_lo, std::optional<double> fixed_hi) {
  Axis a;
  if (fixed_lo) lo = *fixed_lo;
  if (fixed_hi) hi = *fixed_hi;
  widen_if_flat(&lo, &hi);
  std::vector<double> ticks = nice_ticks(lo, hi);
  a.step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  a.lo = fixed_lo ? lo : ticks.front();
  a.hi = fixed_hi ? hi : ticks.back();
  for (double t : ticks)
    if (t >= a.lo - 1e-9 * a.step && t <= a.hi + 1e-9 * a.step) a.ticks.push_back(t);
  return a;
}

Axis log2_axis(double lo, double hi) {
  Axis a;
  a.log2 = true;
  a.lo = std::floor(std::log2(lo));
  a.hi = std::ceil(std::log2(hi));
  if (a.hi <= a.lo) a.hi = a.lo + 1;
  const int span = static_cast<int>(a.hi - a.lo);
  const int every = span > 10 ? (span + 9) / 10 : 1;  // at most ~10 labelled powers of two
  for (int k = static_cast<int>(a.lo); k <= static_cast<int>(a.hi); k += every) a.ticks.push_back(std::exp2(k));
  return a;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) widen_if_flat(&lo, &hi);
  target = std::max(2, target);
  const double rough = (hi - lo) / (target - 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  const double residual = rough / magnitude;
  const double step = magnitude * (residual <= 1.0 ? 1.0 : residual <= 2.0 ? 2.0 : residual <= 5.0 ? 5.0 : 10.0);
  // Rounding the bounds outward to whole steps; a small epsilon keeps 0.3 from becoming 0.30000001 -> 0.4.
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  const int n = static_cast<int>(std::llround((last - first) / step));
  for (int i = 0; i <= n; ++i) ticks.push_back(first + i * step);
  return ticks;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_svg_plot(const PlotSpec& spec) {
  // Data extents over every finite point and reference line.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  bool all_x_positive = true;
  for (const PlotSeries& s : spec.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
      all_x_positive = all_x_positive && x > 0;
    }
  }
  for (const PlotReference& r : spec.references) {
    if (!std::isfinite(r.y)) continue;
    y_lo = std::min(y_lo, r.y);
    y_hi = std::max(y_hi, r.y);
  }
  const bool has_x = x_lo <= x_hi;
  if (!has_x) x_lo = 0.0, x_hi = 1.0, all_x_positive = false;
  if (y_lo > y_hi) y_lo = 0.0, y_hi = 1.0;

  bool use_log2 = false;
  if (spec.x_scale == AxisScale::kLog2) use_log2 = all_x_positive;
  else if (spec.x_scale == AxisScale::kAuto) use_log2 = all_x_positive && x_hi / x_lo >= 4.0;
  const Axis xa = use_log2 ? log2_axis(x_lo, x_hi) : linear_axis(x_lo, x_hi, std::nullopt, std::nullopt);
  const Axis ya = linear_axis(y_lo, y_hi, spec.y_min, spec.y_max);

  // Pixel frame: room on the left for y labels, on the right for the legend.
  const double W = spec.width, H = spec.height;
  const double left = 78, right = W - 200, top = 48, bottom = H - 64;
  auto px = [&](double x) { return left + xa.unit(x) * (right - left); };
  auto py = [&](double y) { return bottom - ya.unit(y) * (bottom - top); };

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << spec.width << "\" height=\""
    << spec.height << "\" viewBox=\"0 0 " << spec.width << " " << spec.height
    << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o << "  <rect x=\"0\" y=\"0\" width=\"" << spec.width << "\" height=\"" << spec.height << "\" fill=\"#ffffff\"/>\n";
  o << "  <text x=\"" << coord((left + right) / 2) << "\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">"
    << xml_escape(spec.title) << "</text>\n";

  // Grid and ticks.
  o << "  <g stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double t : ya.ticks)
    o << "    <line x1=\"" << coord(left) << "\" y1=\"" << coord(py(t)) << "\" x2=\"" << coord(right) << "\" y2=\""
      << coord(py(t)) << "\"/>\n";
  for (double t : xa.ticks)
    o << "    <line x1=\"" << coord(px(t)) << "\" y1=\"" << coord(top) << "\" x2=\"" << coord(px(t)) << "\" y2=\""
      << coord(bottom) << "\"/>\n";
  o << "  </g>\n";
  o << "  <g stroke=\"#000000\" stroke-width=\"1\">\n";
  o << "    <line x1=\"" << coord(left) << "\" y1=\"" << coord(bottom) << "\" x2=\"" << coord(right) << "\" y2=\""
    << coord(bottom) << "\"/>\n";
  o << "    <line x1=\"" << coord(left) << "\" y1=\"" << coord(top) << "\" x2=\"" << coord(left) << "\" y2=\""
    << coord(bottom) << "\"/>\n";
  o << "  </g>\n";
  o << "  <g fill=\"#000000\">\n";
  for (double t : ya.ticks)
    o << "    <text x=\"" << coord(left - 8) << "\" y=\"" << coord(py(t) + 4) << "\" text-anchor=\"end\">"
      << xml_escape(tick_label(t, ya.step)) << "</text>\n";
  for (double t : xa.ticks)
    o << "    <text x=\"" << coord(px(t)) << "\" y=\"" << coord(bottom + 18) << "\" text-anchor=\"middle\">"
      << xml_escape(tick_label(t, xa.log2 ? 1.0 : xa.step)) << "</text>\n";
  o << "    <text x=\"" << coord((left + right) / 2) << "\" y=\"" << coord(H - 22) << "\" text-anchor=\"middle\">"
    << xml_escape(spec.x_label + (xa.log2 ? " (log scale)" : "")) << "</text>\n";
  o << "    <text x=\"20\" y=\"" << coord((top + bottom) / 2) << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
    << coord((top + bottom) / 2) << ")\">" << xml_escape(spec.y_label) << "</text>\n";
  o << "  </g>\n";

  // Reference lines (dashed), then one polyline with markers per series.
  for (size_t i = 0; i < spec.references.size(); ++i) {
    const PlotReference& r = spec.references[i];
    if (!std::isfinite(r.y)) continue;
    o << "  <line x1=\"" << coord(left) << "\" y1=\"" << coord(py(r.y)) << "\" x2=\"" << coord(right) << "\" y2=\""
      << coord(py(r.y)) << "\" stroke=\"" << kReferenceColors[i % 3]
      << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
  }
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const PlotSeries& s = spec.series[i];
    const char* color = kColors[i % kNumColors];
    std::vector<std::pair<double, double>> pts;
    for (const auto& p : s.points)
      if (std::isfinite(p.first) && std::isfinite(p.second) && (!xa.log2 || p.first > 0)) pts.push_back(p);
    std::sort(pts.begin(), pts.end());
    o << "  <polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (size_t k = 0; k < pts.size(); ++k) o << (k ? " " : "") << coord(px(pts[k].first)) << "," << coord(py(pts[k].second));
    o << "\"/>\n";
    for (const auto& [x, y] : pts)
      o << "  <circle cx=\"" << coord(px(x)) << "\" cy=\"" << coord(py(y)) << "\" r=\"3.5\" fill=\"" << color << "\"/>\n";
  }

  // Legend: series first, then references.
  double ly = top + 6;
  const double lx = right + 18;
  for (size_t i = 0; i < spec.series.size(); ++i, ly += 20) {
    const char* color = kColors[i % kNumColors];
    o << "  <line x1=\"" << coord(lx) << "\" y1=\"" << coord(ly) << "\" x2=\"" << coord(lx + 24) << "\" y2=\""
      << coord(ly) << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n";
    o << "  <text x=\"" << coord(lx + 32) << "\" y=\"" << coord(ly + 4) << "\">" << xml_escape(spec.series[i].name)
      << "</text>\n";
  }
  for (size_t i = 0; i < spec.references.size(); ++i, ly += 20) {
    o << "  <line x1=\"" << coord(lx) << "\" y1=\"" << coord(ly) << "\" x2=\"" << coord(lx + 24) << "\" y2=\""
      << coord(ly) << "\" stroke=\"" << kReferenceColors[i % 3] << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
    o << "  <text x=\"" << coord(lx + 32) << "\" y=\"" << coord(ly + 4) << "\">"
      << xml_escape(spec.references[i].name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

Status write_svg_plot(const std::string& path, const PlotSpec& spec) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return invalid_argument("--plot: cannot write '" + path + "'");
  out << render_svg_plot(spec);
  out.close();
  if (!out) return invalid_argument("--plot: writing '" + path + "' failed");
  return Status::ok();
}

}  // namespace origami::eval
