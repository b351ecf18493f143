// The last step of the packed-tile linears (amx_linear.cpp,
// dpbf16_linear.cpp): one row block's float32 sums for a pair of 16-column
// tiles, times the columns' scales for int8 weights, + bias, rounded to
// bfloat16 into the output rows; or, for a SwiGLU gate_up whose tiles
// alternate gate and up, silu(gate) * up. Included only where AVX512F, BW
// and DQ are defined.

#pragma once

#include <immintrin.h>

#include <cstdint>

#include "elementwise_avx512.h"

namespace linear_epilogue {

constexpr int TILE_COLS = 16;  // output columns per packed tile

// The float32 sums of one row block x column pair, not yet rounded into
// `out`: [rows][2 * TILE_COLS], 64-byte aligned.
struct Pending {
  const float *sums = nullptr;
  int64_t rows = 0;
  __mmask32 columns = 0;        // the pair's columns that exist
  const float *bias = nullptr;  // at the pair's first column, or null
  uint16_t *out = nullptr;      // row 0, the pair's first output column
  int64_t out_features = 0;
  bool swiglu = false;          // the pair is (gate, up): out = silu(gate) * up
  // int8 weights: the pair's 32 per-column scales (the sums are of x times
  // the integer weights), in the tiles' order; null for bfloat16 weights.
  const float *scales = nullptr;
};

// Rows [first, last) of a pending pair: + bias, rounded as the element-
// wise kernels round (nearest even, subnormals kept, NaN kept NaN), the
// pair's 32 columns in one store. A (gate, up) pair gives 16 columns of
// silu(gate) * up instead, with the roundings of gate_up's bfloat16 output
// followed by the element-wise silu_and_mul: the same bits as that pair of
// passes, without writing gate_up out and reading it back.
//
// With scales, each sum is first multiplied by its column's scale in
// float32: the int8 weight's dequantized product, as x @ (q * scale).T.
inline void finish_rows(const Pending &p, int64_t first, int64_t last) {
  using namespace elementwise::avx512;
  const __mmask16 low = static_cast<__mmask16>(p.columns), high = static_cast<__mmask16>(p.columns >> 16);
  // Masked-off scales load as 0 and the missing columns are not stored.
  const __m512 scale_low = p.scales ? _mm512_maskz_loadu_ps(p.swiglu ? 0xffff : low, p.scales)
                                    : _mm512_set1_ps(1.0f);
  const __m512 scale_high = p.scales ? _mm512_maskz_loadu_ps(p.swiglu ? 0xffff : high,
                                                             p.scales + TILE_COLS)
                                     : _mm512_set1_ps(1.0f);
  if (p.swiglu) {
    for (int64_t r = first; r < last; ++r) {
      const float *sums = p.sums + r * 2 * TILE_COLS;
      const __m512 gate = round_bf16(_mm512_mul_ps(_mm512_load_ps(sums), scale_low));
      const __m512 up = round_bf16(_mm512_mul_ps(_mm512_load_ps(sums + TILE_COLS), scale_high));
      const __m512i bits = round_bits(_mm512_mul_ps(round_bf16(silu(gate)), up));
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(p.out + r * p.out_features),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
    }
    return;
  }
  // Word 2i + 1 of the two halves in turn: each float's top 16 bits.
  static const __m512i TOP_HALVES = [] {
    alignas(64) uint16_t index[32];
    for (int i = 0; i < 32; ++i) index[i] = static_cast<uint16_t>(2 * i + 1);
    return _mm512_load_si512(index);
  }();
  const __m512 bias_low = p.bias ? _mm512_maskz_loadu_ps(low, p.bias) : _mm512_setzero_ps();
  const __m512 bias_high = p.bias ? _mm512_maskz_loadu_ps(high, p.bias + TILE_COLS) : _mm512_setzero_ps();
  for (int64_t r = first; r < last; ++r) {
    const float *sums = p.sums + r * 2 * TILE_COLS;
    const __m512i a = round_bits(_mm512_fmadd_ps(_mm512_load_ps(sums), scale_low, bias_low));
    const __m512i b =
        round_bits(_mm512_fmadd_ps(_mm512_load_ps(sums + TILE_COLS), scale_high, bias_high));
    _mm512_mask_storeu_epi16(p.out + r * p.out_features, p.columns,
                             _mm512_permutex2var_epi16(a, TOP_HALVES, b));
  }
}

}  // namespace linear_epilogue
