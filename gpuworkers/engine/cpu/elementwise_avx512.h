// One row of each fused element-wise op with AVX-512 intrinsics
// (elementwise.cpp keeps the portable rows and the threading). Included
// only where AVX512F, BW and DQ are defined.
//
// Why intrinsics: gcc vectorised the portable loops with a scalar vmovd
// per element for the bfloat16 bit tricks. Here 32 bfloat16 are loaded as
// one vector and split into two float vectors by integer ops alone: the
// even elements shifted up 16 bits, the odd ones masked (a bfloat16 is the
// top half of a float32). Element-wise arithmetic does not care which
// element sits in which lane, and results go back the same way, so no
// shuffles on the one port that does them (vpmovzxwd / vpmovdw). Any width
// works: the last 32 are masked, and masked-off lanes hold zeros.
//
// Arithmetic is the portable rows' (see elementwise.cpp): same roundings
// to bfloat16 in the same places, statistics in float32; only the order of
// the sum of squares differs, and it is fixed per width, so a row's bits
// depend on that row alone.

#pragma once

#include <immintrin.h>
#include <math.h>

#include <cstdint>

#include "paged_decode_avx512.h"

namespace elementwise {
namespace avx512 {

struct Floats {
  __m512 even, odd;
};

inline __mmask32 mask32(int64_t remaining) {
  return remaining >= 32 ? static_cast<__mmask32>(0xffffffffu)
                         : static_cast<__mmask32>((1u << remaining) - 1);
}

inline Floats load32(const uint16_t *p, __mmask32 m) {
  const __m512i v = _mm512_maskz_loadu_epi16(m, p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// float -> bfloat16 in the top 16 bits, round to nearest even as torch's
// cast does (not vcvtneps2bf16, which flushes subnormals), NaN kept NaN
// (quieted). The low 16 bits are left over: round_bf16 clears them for
// more arithmetic, store32 drops them.
inline __m512i round_bits(__m512 f) {
  const __m512i bits = _mm512_castps_si512(f);
  // +0x7fff carries past a low half above 0x8000, +0x8000 past 0x8000
  // itself too: ties go up where the kept part is odd.
  const __mmask16 odd = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x10000));
  const __m512i rounded = _mm512_mask_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)),
                                                odd, bits, _mm512_set1_epi32(0x8000));
  // A class test, not a compare: -ffast-math lets gcc assume no NaN there.
  const __mmask16 nan = _mm512_fpclass_ps_mask(f, 0x81);
  return _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
}

inline __m512 round_bf16(__m512 f) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(round_bits(f), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// Interleaves the top halves back: even elements from `even`, odd from `odd`.
inline void store32(uint16_t *p, __mmask32 m, __m512i even, __m512i odd) {
  const __m512i v = _mm512_ternarylogic_epi32(_mm512_srli_epi32(even, 16), odd,
                                              _mm512_set1_epi32(static_cast<int>(0xffff0000u)),
                                              0xf8);  // a | (b & c)
  _mm512_mask_storeu_epi16(p, m, v);
}

inline void rms_row(const uint16_t *src, uint16_t *res, const uint16_t *weight, uint16_t *dst,
                    int64_t hidden, float eps) {
  __m512 sum_even = _mm512_setzero_ps(), sum_odd = _mm512_setzero_ps();
  if (res) {
    for (int64_t i = 0; i < hidden; i += 32) {
      const __mmask32 m = mask32(hidden - i);
      const Floats a = load32(res + i, m), b = load32(src + i, m);
      const __m512 even = round_bf16(_mm512_add_ps(a.even, b.even));
      const __m512 odd = round_bf16(_mm512_add_ps(a.odd, b.odd));
      store32(res + i, m, _mm512_castps_si512(even), _mm512_castps_si512(odd));
      sum_even = _mm512_fmadd_ps(even, even, sum_even);
      sum_odd = _mm512_fmadd_ps(odd, odd, sum_odd);
    }
    src = res;
  } else {
    for (int64_t i = 0; i < hidden; i += 32) {
      const Floats v = load32(src + i, mask32(hidden - i));
      sum_even = _mm512_fmadd_ps(v.even, v.even, sum_even);
      sum_odd = _mm512_fmadd_ps(v.odd, v.odd, sum_odd);
    }
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(sum_even, sum_odd));
  const __m512 scale = _mm512_set1_ps(1.f / sqrtf(sum / static_cast<float>(hidden) + eps));
  for (int64_t i = 0; i < hidden; i += 32) {
    const __mmask32 m = mask32(hidden - i);
    const Floats v = load32(src + i, m), w = load32(weight + i, m);
    store32(dst + i, m, round_bits(_mm512_mul_ps(w.even, round_bf16(_mm512_mul_ps(v.even, scale)))),
            round_bits(_mm512_mul_ps(w.odd, round_bf16(_mm512_mul_ps(v.odd, scale)))));
  }
}

// bf16(bf16(a * b) -/+ bf16(c * d)): subtracting is adding the negated
// product (rotate_half's -x), exactly.
inline __m512i rotate(__m512 a, __m512 b, __m512 c, __m512 d, bool subtract) {
  const __m512 ab = round_bf16(_mm512_mul_ps(a, b)), cd = round_bf16(_mm512_mul_ps(c, d));
  return round_bits(subtract ? _mm512_sub_ps(ab, cd) : _mm512_add_ps(ab, cd));
}

inline void rotary_row(uint16_t *row, int64_t heads, int64_t head_dim, const uint16_t *cos_row,
                       const uint16_t *sin_row) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; i += 32) {
    const __mmask32 m = mask32(half - i);
    // The position's cos/sin serve every head of the row.
    const Floats cos_lo = load32(cos_row + i, m), cos_hi = load32(cos_row + half + i, m);
    const Floats sin_lo = load32(sin_row + i, m), sin_hi = load32(sin_row + half + i, m);
    for (int64_t h = 0; h < heads; ++h) {
      uint16_t *lo_p = row + h * head_dim + i, *hi_p = lo_p + half;
      const Floats lo = load32(lo_p, m), hi = load32(hi_p, m);
      store32(lo_p, m, rotate(lo.even, cos_lo.even, hi.even, sin_lo.even, true),
              rotate(lo.odd, cos_lo.odd, hi.odd, sin_lo.odd, true));
      store32(hi_p, m, rotate(hi.even, cos_hi.even, lo.even, sin_hi.even, false),
              rotate(hi.odd, cos_hi.odd, lo.odd, sin_hi.odd, false));
    }
  }
}

// g / (1 + exp(-g)), the division as gcc compiles it under -ffast-math
// (the portable row's): a reciprocal estimate and one Newton step. exp16's
// argument is capped at 89, past which exp overflows to inf anyway.
// min returns its second operand, so NaN stays NaN.
inline __m512 silu(__m512 g) {
  const __m512 minus_g = _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(static_cast<int>(0x80000000u))));
  const __m512 d = _mm512_add_ps(
      _mm512_set1_ps(1.f), paged::avx512::exp16(_mm512_min_ps(_mm512_set1_ps(89.f), minus_g)));
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.f)), r);
  // 1 / inf: the Newton step made NaN of the estimate's 0; g * 0 is -0
  // for a finite g (silu's limit), NaN for -inf (as -inf / inf).
  r = _mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_fpclass_ps_mask(d, 0x08)), r);
  return _mm512_mul_ps(g, r);
}

inline void silu_row(const uint16_t *gate, const uint16_t *up, uint16_t *dst, int64_t width) {
  for (int64_t i = 0; i < width; i += 32) {
    const __mmask32 m = mask32(width - i);
    const Floats g = load32(gate + i, m), u = load32(up + i, m);
    store32(dst + i, m, round_bits(_mm512_mul_ps(round_bf16(silu(g.even)), u.even)),
            round_bits(_mm512_mul_ps(round_bf16(silu(g.odd)), u.odd)));
  }
}

}  // namespace avx512
}  // namespace elementwise
