// Building blocks of the AVX-512 decode kernel (paged_decode_avx512.cpp):
// conversions, exp, softmax, the per-row state and register budgets.
// Included only where __AVX512F__ is defined.

#pragma once

#include <immintrin.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "paged_decode.h"

namespace paged {
namespace avx512 {

// Blocks (a work item's kv heads of them) are prefetched this far ahead
// into L2: one block's work is much shorter than a DRAM miss, and L2 tracks
// more misses in flight than L1 (into L1, or 2 ahead, one core read ~9 GB/s
// from DRAM; this way ~15). With all-heads items and spread prefetches
// (paged_decode_avx512.cpp), 2, 3, 4, 6 and 8 measured alike.
constexpr int PREFETCH_AHEAD = 4;

inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
// bfloat16 is the top half of a float32.
inline __m512 load16(const uint16_t *p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void prefetch_span(const void *start, int64_t bytes) {
  const char *p = static_cast<const char *>(start);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T1);
}

// Step i of n of prefetching `lines` lines from p (nullptr: none): the
// lines [i * lines / n, (i + 1) * lines / n).
inline void prefetch_step(const char *p, int64_t lines, int64_t i, int64_t n) {
  if (p == nullptr) return;
  for (int64_t line = i * lines / n, end = (i + 1) * lines / n; line < end; ++line)
    _mm_prefetch(p + line * 64, _MM_HINT_T1);
}

// exp(x) for the softmax's x <= 0: 2^n * e^r with n = round(x / ln 2) and
// |r| <= ln2 / 2, e^r by Cephes' degree-6 expf polynomial (about 1 ulp).
// Below -87 the result is 0 or a subnormal's neighbour: irrelevant next to
// the peak's e^0 = 1. NaN stays NaN (max returns its second operand).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

inline __mmask16 tail_mask(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << remaining) - 1);
}

// Per-row state inside the thread's scratch buffer.
struct Row {
  int64_t len, blocks, padded;
  float *query;  // [GROUP][HEAD_DIM], scaled
  float *score;  // [GROUP][padded]: scores, then softmax numerators
  float *acc;    // [GROUP][HEAD_DIM]: weighted sum of values
  float inv[8];  // 1 / softmax denominator per head
};

// Register budget (of 32 zmm) for accumulators: rows are tiled so that
// several rows share each key and value load while the accumulators stay
// in registers. Values use at most 2 rows a tile: with 4, the heads of a
// tile shrink to 1 and each value pair is rebuilt per head (measured: 5
// draft rows over one sequence took 1.2 ms with 4, 0.8 ms with 2).
constexpr int ACC_REGS = 24;
constexpr int MAX_TILE_ROWS = 4;
constexpr int VALUE_TILE_ROWS = 2;

// What the value-weighing loops (weigh_rows, weigh_rows_bf16) share: how
// many of block b's tokens each of R rows sees (seen) and the most of them;
// and the rows' accumulators of heads [g0, g0 + TILE), into registers and
// back.
template <int R, int BLOCK>
inline int64_t block_extents(Row *const *rows, int64_t b, int64_t (&seen)[R]) {
  int64_t most = 0;
  for (int r = 0; r < R; ++r) {
    seen[r] = std::min<int64_t>(BLOCK, rows[r]->len - b * BLOCK);
    most = std::max(most, seen[r]);
  }
  return most;
}

template <int R, int TILE, int NV, int GROUP, int HEAD_DIM>
inline void load_accumulators(__m512 (&acc)[R][TILE][NV], Row *const *rows, int g0) {
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < TILE; ++g)
      if (g0 + g < GROUP)
        for (int c = 0; c < NV; ++c)
          acc[r][g][c] = _mm512_loadu_ps(rows[r]->acc + (g0 + g) * HEAD_DIM + c * 16);
}

template <int R, int TILE, int NV, int GROUP, int HEAD_DIM>
inline void store_accumulators(const __m512 (&acc)[R][TILE][NV], Row *const *rows, int g0) {
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < TILE; ++g)
      if (g0 + g < GROUP)
        for (int c = 0; c < NV; ++c)
          _mm512_storeu_ps(rows[r]->acc + (g0 + g) * HEAD_DIM + c * 16, acc[r][g][c]);
}

// Independent chains per score: FMA latency is 4 cycles and each chain is
// HEAD_DIM long, so few heads split their dims into even and odd chains.
template <int GROUP, int BLOCK>
constexpr int score_split() { return GROUP * (BLOCK / 16) >= 8 ? 1 : 2; }

template <int GROUP, int BLOCK>
constexpr int score_tile_rows() {
  constexpr int per_row = score_split<GROUP, BLOCK>() * GROUP * (BLOCK / 16);
  constexpr int rows = ACC_REGS / per_row;
  return rows < 1 ? 1 : rows > MAX_TILE_ROWS ? MAX_TILE_ROWS : rows;
}

// float32 pools are for tests and references: one row at a time there
// halves the build time.
template <typename T>
constexpr int tile_rows(int rows) { return std::is_same_v<T, float> ? 1 : rows; }

// The rows of `active` (count of them) in tiles of up to TILE_ROWS.
template <int TILE_ROWS, typename F>
inline void in_tiles(Row *const *active, int count, F &&tile) {
  for (int i = 0; i < count; i += TILE_ROWS) {
    const int n = count - i < TILE_ROWS ? count - i : TILE_ROWS;
    switch (n) {
      case 1: tile(active + i, std::integral_constant<int, 1>()); break;
      case 2: if constexpr (TILE_ROWS >= 2) tile(active + i, std::integral_constant<int, 2>()); break;
      case 3: if constexpr (TILE_ROWS >= 3) tile(active + i, std::integral_constant<int, 3>()); break;
      case 4: if constexpr (TILE_ROWS >= 4) tile(active + i, std::integral_constant<int, 4>()); break;
    }
  }
}

// In place: s[t] = exp(s[t] - max) for t < len; returns 1 / sum.
inline float softmax_numerators(float *s, int64_t len) {
  __m512 peak = _mm512_set1_ps(-INFINITY);
  for (int64_t t = 0; t < len; t += 16)
    peak = _mm512_max_ps(peak, _mm512_mask_loadu_ps(peak, tail_mask(len - t), s + t));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; t += 16) {
    const __mmask16 m = tail_mask(len - t);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), top));
    _mm512_mask_storeu_ps(s + t, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

}  // namespace avx512
}  // namespace paged
