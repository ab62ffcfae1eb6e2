#include "model/fp8_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/fp8.h"
#include "model/weight_layout.h"

namespace origami {

std::vector<float> Fp8Matrix::dequantize() const {
  std::vector<float> out(codes.size());
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const size_t base = static_cast<size_t>(r) * cols;
    for (int64_t c = 0; c < cols; ++c) out[base + c] = fp8_e4m3_to_f32(codes[base + c]) * scales[r];
  }
  return out;
}

namespace {

Expected<float> scalar_scale(const TensorView& t) {
  float v = 0.0f;
  convert_to_f32(t.data, t.dtype, 1, &v);
  if (!(v > 0.0f) || !std::isfinite(v))
    return invalid_file("tensor '" + t.name + "': FP8 scales must be positive and finite");
  return v;
}

}  // namespace

Expected<Fp8Matrix> fp8_matrix(const TensorView& weight, const Fp8Scales& scales) {
  if (weight.shape.size() != 2) return invalid_argument("tensor '" + weight.name + "' is not a matrix");
  Fp8Matrix m;
  m.rows = weight.shape[0];
  m.cols = weight.shape[1];
  const size_t n = static_cast<size_t>(m.rows) * static_cast<size_t>(m.cols);
  m.codes.resize(n);
  m.scales.resize(static_cast<size_t>(m.rows));
  if (weight.dtype == DType::kF8E4M3) {
    if (scales.weight_scale.empty()) return not_found("tensor '" + weight.name + "' is F8_E4M3 but has no weight_scale");
    std::memcpy(m.codes.data(), weight.data, n);
    if (scales.weight_scale.numel() == m.rows && m.rows != 1) {
      m.scales = scales.weight_scale.to_f32();
      for (float s : m.scales)
        if (!(s > 0.0f) || !std::isfinite(s))
          return invalid_file("tensor '" + scales.weight_scale.name + "': FP8 scales must be positive and finite");
    } else {
      ORIGAMI_CHECK(scales.weight_scale.numel() == 1);  // the loader checked the shape
      ORIGAMI_ASSIGN_OR_RETURN(const float s, scalar_scale(scales.weight_scale));
      std::fill(m.scales.begin(), m.scales.end(), s);
    }
    if (!scales.input_scale.empty()) {
      ORIGAMI_ASSIGN_OR_RETURN(m.input_scale, scalar_scale(scales.input_scale));
    }
    return m;
  }
  // Quantize per output channel, row by row (rows are independent: parallel, thread-count free).
  const size_t elem = dtype_size(weight.dtype);
  const uint8_t* src = static_cast<const uint8_t*>(weight.data);
#pragma omp parallel if (m.rows > 64)
  {
    std::vector<float> row(static_cast<size_t>(m.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m.rows; ++r) {
      convert_to_f32(src + static_cast<size_t>(r) * m.cols * elem, weight.dtype, row.size(), row.data());
      quantize_rows_fp8(row.data(), 1, row.size(), row.size(), m.codes.data() + static_cast<size_t>(r) * m.cols,
                        m.scales.data() + r);
    }
  }
  return m;
}

Fp8Matrix stack_fp8_rows(const std::vector<const Fp8Matrix*>& parts) {
  ORIGAMI_CHECK(!parts.empty());
  Fp8Matrix out;
  out.cols = parts[0]->cols;
  bool dynamic = false;
  for (const Fp8Matrix* p : parts) {
    ORIGAMI_CHECK(p->cols == out.cols);
    out.rows += p->rows;
    out.codes.insert(out.codes.end(), p->codes.begin(), p->codes.end());
    out.scales.insert(out.scales.end(), p->scales.begin(), p->scales.end());
    dynamic = dynamic || p->input_scale <= 0.0f;
    out.input_scale = std::max(out.input_scale, p->input_scale);
  }
  if (dynamic) out.input_scale = 0.0f;
  return out;
}

Fp8Matrix fp8_rows(const Fp8Matrix& m, int64_t begin, int64_t count) {
  ORIGAMI_CHECK(begin >= 0 && count >= 0 && begin + count <= m.rows);
  Fp8Matrix out;
  out.rows = count;
  out.cols = m.cols;
  out.input_scale = m.input_scale;
  out.codes.assign(m.codes.begin() + begin * m.cols, m.codes.begin() + (begin + count) * m.cols);
  out.scales.assign(m.scales.begin() + begin, m.scales.begin() + begin + count);
  return out;
}

Fp8Matrix fp8_cols(const Fp8Matrix& m, int64_t begin, int64_t count) {
  ORIGAMI_CHECK(begin >= 0 && count >= 0 && begin + count <= m.cols);
  Fp8Matrix out;
  out.rows = m.rows;
  out.cols = count;
  out.input_scale = m.input_scale;
  out.scales = m.scales;
  out.codes.resize(static_cast<size_t>(m.rows) * count);
  for (int64_t r = 0; r < m.rows; ++r)
    std::memcpy(out.codes.data() + r * count, m.codes.data() + r * m.cols + begin, static_cast<size_t>(count));
  return out;
}

}  // namespace origami
