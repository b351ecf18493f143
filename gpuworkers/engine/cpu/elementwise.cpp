// Fused bfloat16 element-wise ops of a Llama layer, one pass each over
// memory where torch's eager ops make four to ten (casts, pow, mean, cat,
// neg, mul, add). They round to bfloat16 exactly where the torch code they
// replace does (models/layers.py), so their results match it but for the
// last bit of exp() in SiLU.
//
// Each op is a function of one row, run for every row; where the compiler
// targets AVX-512, elementwise_avx512.h's rows replace the portable ones
// below. A row's bits depend on that row alone, whatever the row count or
// threads. Large calls split rows across OpenMP threads (torch's pool, see
// paged_decode.cpp); small ones run on the calling thread.

#include <math.h>

#include <cstdint>
#include <cstring>

namespace elementwise {
namespace portable {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// torch's bfloat16 arithmetic: compute in float32, round the result.
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

inline void rms_row(const uint16_t *src, uint16_t *res, const uint16_t *weight, uint16_t *dst,
                    int64_t hidden, float eps) {
  float sum = 0.f;
  if (res) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = round_bf16(bf16_to_float(res[i]) + bf16_to_float(src[i]));
      res[i] = float_to_bf16(v);
      sum += v * v;
    }
    src = res;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < hidden; ++i) {
      const float v = bf16_to_float(src[i]);
      sum += v * v;
    }
  }
  const float scale = 1.f / sqrtf(sum / static_cast<float>(hidden) + eps);
#pragma omp simd
  for (int64_t i = 0; i < hidden; ++i) {
    const float normed = round_bf16(bf16_to_float(src[i]) * scale);
    dst[i] = float_to_bf16(bf16_to_float(weight[i]) * normed);
  }
}

inline void rotary_row(uint16_t *row, int64_t heads, int64_t head_dim, const uint16_t *cos_row,
                       const uint16_t *sin_row) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t *head = row + h * head_dim;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float lo = bf16_to_float(head[i]);
      const float hi = bf16_to_float(head[i + half]);
      const float new_lo = round_bf16(lo * bf16_to_float(cos_row[i])) +
                           round_bf16(-hi * bf16_to_float(sin_row[i]));
      const float new_hi = round_bf16(hi * bf16_to_float(cos_row[i + half])) +
                           round_bf16(lo * bf16_to_float(sin_row[i + half]));
      head[i] = float_to_bf16(new_lo);
      head[i + half] = float_to_bf16(new_hi);
    }
  }
}

inline void silu_row(const uint16_t *gate, const uint16_t *up, uint16_t *dst, int64_t width) {
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) {
    const float g = bf16_to_float(gate[i]);
    // Past -88.72 exp(-g) is inf, and gcc's vectorised division (a
    // reciprocal estimate and a Newton step) makes NaN of g / inf.
    const float silu = -g > 88.72283935546875f ? copysignf(0.f, g)
                                                 : round_bf16(g / (1.f + expf(-g)));
    dst[i] = float_to_bf16(silu * bf16_to_float(up[i]));
  }
}

}  // namespace portable
}  // namespace elementwise

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#include "elementwise_avx512.h"
namespace rows = elementwise::avx512;
#else
namespace rows = elementwise::portable;
#endif

namespace {

// Below these many elements a call runs on the calling thread: waking the
// pool and splitting the rows cost more than they save. Both are 2-3 us
// of work on one core, where 2 threads started to win (measured with
// AVX-512 on a 2-core Xeon: rms_norm at 12 rows of 576, rotary 12-16 rows
// of 12 heads x 64, silu 3-4 rows of 1536, whose exp and division make
// each element ~2x dearer).
constexpr int64_t SERIAL_ELEMENTS = 8192;
constexpr int64_t SERIAL_SILU_ELEMENTS = 4096;

// row(r) for r < count, split across threads above `serial` elements.
template <typename F>
inline void for_rows(int64_t count, int64_t width, int64_t serial, F &&row) {
  if (count * width < serial) {
    for (int64_t r = 0; r < count; ++r) row(r);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) row(r);
}

}  // namespace

extern "C" {

// out = weight * bf16(x * rsqrt(mean(x^2) + eps)), the statistics in float32.
// With residual != nullptr, first residual = bf16(residual + x) in place and
// normalise that (the layer's "x = x + h; norm(x)").
void rms_norm_bf16(const uint16_t *x, uint16_t *residual, const uint16_t *weight,
                   uint16_t *out, int64_t count, int64_t hidden, int64_t x_stride, float eps) {
  for_rows(count, hidden, SERIAL_ELEMENTS, [&](int64_t r) {
    rows::rms_row(x + r * x_stride, residual ? residual + r * hidden : nullptr, weight,
                  out + r * hidden, hidden, eps);
  });
}

// Rotary embedding in place, rotate-half convention, on the first
// `heads` heads of each row: x = bf16(bf16(x*cos) + bf16(rotate_half(x)*sin)).
// Row r holds token r; cos/sin are [max_positions, head_dim] bfloat16.
void rotary_bf16(uint16_t *x, int64_t count, int64_t row_stride, int64_t heads,
                 int64_t head_dim, const int64_t *positions, const uint16_t *cos_table,
                 const uint16_t *sin_table) {
  for_rows(count, heads * head_dim, SERIAL_ELEMENTS, [&](int64_t r) {
    rows::rotary_row(x + r * row_stride, heads, head_dim, cos_table + positions[r] * head_dim,
                     sin_table + positions[r] * head_dim);
  });
}

// out[r] = bf16(bf16(silu(gate)) * up) for gate_up rows [gate | up].
void silu_and_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t count, int64_t width) {
  for_rows(count, width, SERIAL_SILU_ELEMENTS, [&](int64_t r) {
    const uint16_t *gate = gate_up + r * 2 * width;
    rows::silu_row(gate, gate + width, out + r * width, width);
  });
}

}  // extern "C"
