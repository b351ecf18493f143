// The bfloat16 pair path of the AVX-512 decode kernel (vdpbf16ps), used
// by paged_decode_avx512.cpp where the compiler targets AVX512_BF16.

#pragma once

#include "paged_decode_avx512.h"

namespace paged {
namespace avx512 {

#ifdef __AVX512BF16__
// bfloat16 pools: vdpbf16ps multiplies pairs of bfloat16 exactly and adds
// both products to a float32 lane, half the instructions of widening and
// FMAs. Scores pair two dims of a key (the query's bf16 pair broadcast,
// the scale applied to the sum); values pair two tokens, weighted by the
// softmax numerators rounded to bfloat16 (the gather path and flash
// attention round probabilities the same way before P @ V).

// Word indices interleaving two rows of keys: lane j gets (a[j], b[j]).
alignas(64) constexpr uint16_t PAIR_16[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                              21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                              11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
alignas(64) constexpr uint16_t PAIR_LO[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6, 38, 7, 39, 8, 40, 9, 41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) constexpr uint16_t PAIR_HI[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                              53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                              27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Keys of dims d and d + 1 for the block's BLOCK tokens, as pairs.
template <int BLOCK>
inline void key_pairs(const uint16_t *keys, int d, __m512i *out) {
  if constexpr (BLOCK == 16) {
    const __m512i both = _mm512_loadu_si512(keys + d * 16);
    out[0] = _mm512_permutexvar_epi16(_mm512_load_si512(PAIR_16), both);
  } else {
    static_assert(BLOCK == 32);
    const __m512i a = _mm512_loadu_si512(keys + d * 32), b = _mm512_loadu_si512(keys + (d + 1) * 32);
    out[0] = _mm512_permutex2var_epi16(a, _mm512_load_si512(PAIR_LO), b);
    out[1] = _mm512_permutex2var_epi16(a, _mm512_load_si512(PAIR_HI), b);
  }
}

// score_rows for bfloat16; row.query holds the raw bf16 query. pf (or
// nullptr): one kv head of a block to prefetch into L2 along the way, a line or two
// between loads (see attend in paged_decode_avx512.cpp for why).
template <int R, int GROUP, int HEAD_DIM, int BLOCK>
inline void score_rows_bf16(Row *const *rows, const uint16_t *keys, int64_t b, float scale,
                            const char *pf = nullptr) {
  constexpr int64_t LINES = HEAD_DIM * BLOCK * 2 / 64;
  constexpr int NB = BLOCK / 16;
  constexpr int SPLIT = score_split<GROUP, BLOCK>();
  __m512 acc[R][SPLIT][GROUP][NB];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < SPLIT; ++s)
      for (int g = 0; g < GROUP; ++g)
        for (int c = 0; c < NB; ++c) acc[r][s][g][c] = _mm512_setzero_ps();
  for (int d = 0; d < HEAD_DIM; d += 2 * SPLIT) {
    prefetch_step(pf, LINES, d / (2 * SPLIT), HEAD_DIM / (2 * SPLIT));
    for (int s = 0; s < SPLIT; ++s) {
      __m512i key[NB];
      key_pairs<BLOCK>(keys, d + 2 * s, key);
      for (int r = 0; r < R; ++r) {
        const uint32_t *pairs = reinterpret_cast<const uint32_t *>(rows[r]->query);
        for (int g = 0; g < GROUP; ++g) {
          const __m512i qd = _mm512_set1_epi32(pairs[(g * HEAD_DIM + d) / 2 + s]);
          for (int c = 0; c < NB; ++c) acc[r][s][g][c] = dot_pairs(acc[r][s][g][c], qd, key[c]);
        }
      }
    }
  }
  const __m512 scaled = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < NB; ++c) {
        __m512 sum = acc[r][0][g][c];
        for (int s = 1; s < SPLIT; ++s) sum = _mm512_add_ps(sum, acc[r][s][g][c]);
        _mm512_storeu_ps(rows[r]->score + g * rows[r]->padded + b * BLOCK + c * 16,
                         _mm512_mul_ps(sum, scaled));
      }
}

// The softmax numerators of a row as bfloat16, in place over the float32
// scores (element i's bf16 lands at or before float i, read first), zero
// past the row's length: a pair ending past it adds 0 * 0.
inline void weights_to_bf16(Row &row, int group) {
  uint16_t *w = reinterpret_cast<uint16_t *>(row.score);
  for (int g = 0; g < group; ++g)
    for (int64_t t = 0; t < row.padded; t += 32) {
      const int64_t at = g * row.padded + t;
      const __m512 lo = _mm512_maskz_loadu_ps(tail_mask(row.len - t), row.score + at);
      const __m512 hi = _mm512_maskz_loadu_ps(tail_mask(std::max<int64_t>(row.len - t - 16, 0)),
                                              row.score + at + 16);
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      if (t + 32 <= row.padded)
        _mm512_storeu_si512(w + at, both);
      else  // the last 16 of an odd number of 16s
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(w + at), _mm512_castsi512_si256(both));
    }
}

// Where dim d of a row's accumulators lives: values are paired with
// unpacklo/hi (within 128-bit lanes), so each 32 dims' two accumulators
// hold dims {0-3, 8-11, 16-19, 24-27} and {4-7, 12-15, ...}.
inline int value_lane(int d) {
  const int w = d % 32, lane = w / 8, p = w % 8;
  return (d / 32) * 32 + (p >= 4) * 16 + lane * 4 + (p & 3);
}

// weigh_rows for bfloat16: tokens o and o + 1 per instruction. A row whose
// tokens end at an odd count pairs its last token with zeros, the same
// alone or with rows that see further. pf: as for score_rows_bf16.
template <int R, int GROUP, int HEAD_DIM, int BLOCK>
inline void weigh_rows_bf16(Row *const *rows, const uint16_t *values, int64_t b,
                            const char *pf = nullptr) {
  constexpr int64_t LINES = HEAD_DIM * BLOCK * 2 / 64;
  constexpr int NV = HEAD_DIM / 16;
  constexpr int FIT = ACC_REGS / (NV * R);
  constexpr int TILE = FIT < 1 ? 1 : FIT < GROUP ? FIT : GROUP;
  int64_t seen[R];
  const int64_t most = block_extents<R, BLOCK>(rows, b, seen);
  for (int g0 = 0; g0 < GROUP; g0 += TILE) {
    __m512 acc[R][TILE][NV];
    load_accumulators<R, TILE, NV, GROUP, HEAD_DIM>(acc, rows, g0);
    for (int64_t o = 0; o < most; o += 2) {
      if (g0 == 0) prefetch_step(pf, LINES, o / 2, (most + 1) / 2);
      const bool pair = o + 1 < most;
      __m512i full[NV], half[NV];
      bool halves = false;
      for (int r = 0; r < R; ++r) halves |= pair && seen[r] == o + 1;
      for (int c = 0; c < NV; c += 2) {
        const __m512i a = _mm512_loadu_si512(values + o * HEAD_DIM + c * 16);
        const __m512i n = pair ? _mm512_loadu_si512(values + (o + 1) * HEAD_DIM + c * 16)
                               : _mm512_setzero_si512();
        full[c] = _mm512_unpacklo_epi16(a, n);
        full[c + 1] = _mm512_unpackhi_epi16(a, n);
        if (halves) {
          half[c] = _mm512_unpacklo_epi16(a, _mm512_setzero_si512());
          half[c + 1] = _mm512_unpackhi_epi16(a, _mm512_setzero_si512());
        }
      }
      for (int r = 0; r < R; ++r) {
        if (o >= seen[r]) continue;
        const __m512i *value = o + 1 < seen[r] || !pair ? full : half;
        const uint16_t *weight = reinterpret_cast<const uint16_t *>(rows[r]->score) + b * BLOCK + o;
        for (int g = 0; g < TILE; ++g)
          if (g0 + g < GROUP) {
            uint32_t w2;
            std::memcpy(&w2, weight + (g0 + g) * rows[r]->padded, sizeof w2);
            const __m512i w = _mm512_set1_epi32(static_cast<int>(w2));
            for (int c = 0; c < NV; ++c) acc[r][g][c] = dot_pairs(acc[r][g][c], w, value[c]);
          }
      }
    }
    store_accumulators<R, TILE, NV, GROUP, HEAD_DIM>(acc, rows, g0);
  }
}

constexpr bool PAIRED_BF16 = true;
#else
// Declared for the kernel's discarded `if constexpr (paired)` branches.
constexpr bool PAIRED_BF16 = false;
inline int value_lane(int d) { return d; }
inline void weights_to_bf16(Row &, int) {}
template <int R, int GROUP, int HEAD_DIM, int BLOCK>
void score_rows_bf16(Row *const *, const uint16_t *, int64_t, float, const char * = nullptr);
template <int R, int GROUP, int HEAD_DIM, int BLOCK>
void weigh_rows_bf16(Row *const *, const uint16_t *, int64_t, const char * = nullptr);
#endif

}  // namespace avx512
}  // namespace paged
