// The vdpbf16ps tiles of the prefill attention kernel (prefill_attention.cpp):
// packing into pair layouts, the two matmul microkernels, the online
// softmax of one row over one key tile, the bfloat16 output.
// Included only where __AVX512BF16__ is defined.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "paged_decode_bf16.h"

namespace prefill {

using paged::avx512::dot_pairs;
using paged::avx512::exp16;
using paged::avx512::tail_mask;

// Keys per tile: one row's scores of a tile are 4 vectors, so a tile's
// softmax and the score microkernel's accumulators stay in registers.
constexpr int TILE = 64;
// Rows per microkernel call: 6 x 4 accumulators (24 of 32 registers) and
// 4 key or value vectors, each vector load feeding 6 instructions.
constexpr int ROW_TILE = 6;
// The running max before a row's first tile: finite (the library is built
// with -ffast-math, which assumes no infinities), and far enough below any
// score that its rescale factor is exp's floor times a zero sum.
constexpr float NO_MAX = -1e30f;

// Two bfloat16 as one 32-bit lane, broadcast: a query's dims d, d + 1 or
// a row's probabilities of keys t, t + 1.
inline __m512i broadcast_pair(const uint16_t *p) {
  uint32_t pair;
  std::memcpy(&pair, p, sizeof pair);
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// 16 keys' dims d and d + 1 as pairs, from the pool's transposed block
// rows (row d + 1 is `stride` after row d); pairs past `count` are zero.
inline __m512i key_pairs(const uint16_t *row, int64_t stride, int64_t count) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + stride));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  const __m512i pairs = _mm512_permutexvar_epi16(_mm512_load_si512(paged::avx512::PAIR_16), both);
  return _mm512_maskz_mov_epi32(tail_mask(count), pairs);
}

// 32 dims of value rows t and t + 1 as 32 pairs (dims in order) at out;
// a null row is a key past the sequence: zeros.
inline void value_pairs(const uint16_t *a, const uint16_t *b, uint16_t *out) {
  const __m512i x = a ? _mm512_loadu_si512(a) : _mm512_setzero_si512();
  const __m512i y = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
  _mm512_storeu_si512(out, _mm512_permutex2var_epi16(x, _mm512_load_si512(paged::avx512::PAIR_LO), y));
  _mm512_storeu_si512(out + 32,
                      _mm512_permutex2var_epi16(x, _mm512_load_si512(paged::avx512::PAIR_HI), y));
}

// scores[r][t] = q[r] . key t for R rows (queries [R][HEAD_DIM] bfloat16),
// the first NC * 16 keys of one packed key tile ([HEAD_DIM / 2][TILE][2]).
// Unscaled.
template <int R, int NC, int HEAD_DIM>
inline void score_tile(const uint16_t *q, const uint16_t *keys, float (*scores)[TILE]) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int dp = 0; dp < HEAD_DIM / 2; ++dp) {
    __m512i key[NC];
    for (int c = 0; c < NC; ++c) key[c] = _mm512_loadu_si512(keys + (dp * TILE + c * 16) * 2);
    for (int r = 0; r < R; ++r) {
      const __m512i qd = broadcast_pair(q + r * HEAD_DIM + 2 * dp);
      for (int c = 0; c < NC; ++c) acc[r][c] = dot_pairs(acc[r][c], qd, key[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_store_ps(scores[r] + c * 16, acc[r][c]);
}

// One row's online softmax step over a tile where it sees `visible` keys
// (0..TILE): updates its running max and sum, writes its probabilities
// (bfloat16, zero past visible) and returns the factor that rescales its
// accumulators. A tile it sees none of changes nothing: factor 1, zeros.
// Called for every row from one place: one instruction sequence for all.
inline float softmax_tile(const float *scores, int visible, float scale, float &max, float &sum,
                          uint16_t *probs) {
  constexpr int NC = TILE / 16;
  if (visible == 0) {
    std::memset(probs, 0, TILE * sizeof(uint16_t));
    return 1.f;
  }
  __m512 x[NC];
  __mmask16 seen[NC];
  __m512 peak = _mm512_set1_ps(NO_MAX);
  for (int c = 0; c < NC; ++c) {
    seen[c] = tail_mask(visible - c * 16);
    x[c] = _mm512_mul_ps(_mm512_load_ps(scores + c * 16), _mm512_set1_ps(scale));
    peak = _mm512_mask_max_ps(peak, seen[c], peak, x[c]);
  }
  const float top = std::max(max, _mm512_reduce_max_ps(peak));
  const float factor = top == max ? 1.f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(max - top)));
  __m512 e[NC], total = _mm512_setzero_ps();
  for (int c = 0; c < NC; ++c) {
    e[c] = _mm512_maskz_mov_ps(seen[c], exp16(_mm512_sub_ps(x[c], _mm512_set1_ps(top))));
    total = _mm512_add_ps(total, e[c]);
  }
  for (int c = 0; c < NC; c += 2)
    _mm512_storeu_si512(probs + c * 16, (__m512i)_mm512_cvtne2ps_pbh(e[c + 1], e[c]));
  sum = sum * factor + _mm512_reduce_add_ps(total);
  max = top;
  return factor;
}

// acc[r] = acc[r] * factor[r] + sum over the tile's first 2 * pairs keys
// of probs[r][t] * value t, for R rows (accumulators [R][HEAD_DIM] float32,
// values packed [TILE / 2][HEAD_DIM][2]). 64 dims at a time, so that the
// accumulators fit in registers for head_dim 128 too.
template <int R, int HEAD_DIM>
inline void weigh_tile(const uint16_t (*probs)[TILE], const uint16_t *values, int pairs,
                       const float *factor, float *acc) {
  for (int d0 = 0; d0 < HEAD_DIM; d0 += 64) {
    __m512 o[R][4];
    for (int r = 0; r < R; ++r) {
      const __m512 f = _mm512_set1_ps(factor[r]);
      for (int c = 0; c < 4; ++c)
        o[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * HEAD_DIM + d0 + c * 16), f);
    }
    for (int j = 0; j < pairs; ++j) {
      __m512i value[4];
      for (int c = 0; c < 4; ++c)
        value[c] = _mm512_loadu_si512(values + (j * HEAD_DIM + d0 + c * 16) * 2);
      for (int r = 0; r < R; ++r) {
        const __m512i w = broadcast_pair(probs[r] + 2 * j);
        for (int c = 0; c < 4; ++c) o[r][c] = dot_pairs(o[r][c], w, value[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + r * HEAD_DIM + d0 + c * 16, o[r][c]);
  }
}

// out = bfloat16(acc * inv), rounded to nearest even as torch's cast does
// (vcvtneps2bf16 would flush subnormals); NaN stays NaN.
template <int HEAD_DIM>
inline void store_row(const float *acc, float inv, uint16_t *out) {
  const __m512i one = _mm512_set1_epi32(1);
  for (int c = 0; c < HEAD_DIM / 16; ++c) {
    const __m512i bits =
        _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(acc + c * 16), _mm512_set1_ps(inv)));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + c * 16),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  }
}

// f(std::integral_constant<int, n>) for n in 1..6: the microkernels take
// their row and key-vector counts as template parameters (registers, not
// memory).
template <typename F>
inline void with_count(int n, F &&f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    case 6: f(std::integral_constant<int, 6>()); break;
  }
}

}  // namespace prefill
