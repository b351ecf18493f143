// The AMX tiles of the prefill attention kernel (prefill_attention.cpp):
// both matmuls as tdpbf16ps on 16 rows at a time, reading the same packed
// keys and values as the vdpbf16ps tiles (prefill_attention.h), whose
// softmax and output they share. Included only where __AMX_TILE__,
// __AMX_BF16__ and __AVX512BF16__ are defined.
//
// Tile registers (every tile 16 rows of 64 bytes): 0 = A (16 rows x 32
// bfloat16: query dims, or probabilities of 32 keys); 2, 3 = B (16 pairs x
// 16 columns x 2: the packed keys [HEAD_DIM / 2][TILE][2] and values
// [TILE / 2][HEAD_DIM][2] are already in this shape, 64-byte slices of
// rows TILE * 4 or HEAD_DIM * 4 bytes apart); 4-7 = C (16 x 16 float32).
// The two B registers alternate so that a load can overlap the previous
// product.

#pragma once

#include "amx_tiles.h"
#include "prefill_attention.h"

namespace prefill {

// Rows of an A and a C tile.
constexpr int AMX_ROWS = 16;
// bfloat16 per A row: query dims (S = Q K^T) or keys (P V) per tdpbf16ps.
constexpr int AMX_DEPTH = 32;

inline amx::TileConfig amx_config() {
  amx::TileConfig c;
  for (int t : {0, 2, 3, 4, 5, 6, 7}) c.rows[t] = AMX_ROWS, c.colsb[t] = 64;
  return c;
}

using amx::compiler_barrier;

// scores[r * TILE + t] = q[r] . key t for 16 rows (queries [16][HEAD_DIM])
// and the first 16 * nc (1..4) keys of one packed key tile. Unscaled.
template <int HEAD_DIM>
inline void amx_score_tile(const uint16_t *q, const uint16_t *keys, int nc, float *scores) {
  constexpr int64_t Q_ROW = HEAD_DIM * 2, KEY_ROW = TILE * 4, SCORE_ROW = TILE * 4;
  compiler_barrier();
  _tile_zero(4);
  if (nc > 1) _tile_zero(5);
  if (nc > 2) _tile_zero(6);
  if (nc > 3) _tile_zero(7);
  for (int d = 0; d < HEAD_DIM; d += AMX_DEPTH) {
    const uint16_t *k = keys + d * TILE;  // dim pair d / 2's row
    _tile_loadd(0, q + d, Q_ROW);
    _tile_loadd(2, k, KEY_ROW);
    _tile_dpbf16ps(4, 0, 2);
    if (nc > 1) {
      _tile_loadd(3, k + 32, KEY_ROW);
      _tile_dpbf16ps(5, 0, 3);
    }
    if (nc > 2) {
      _tile_loadd(2, k + 64, KEY_ROW);
      _tile_dpbf16ps(6, 0, 2);
    }
    if (nc > 3) {
      _tile_loadd(3, k + 96, KEY_ROW);
      _tile_dpbf16ps(7, 0, 3);
    }
  }
  _tile_stored(4, scores, SCORE_ROW);
  if (nc > 1) _tile_stored(5, scores + 16, SCORE_ROW);
  if (nc > 2) _tile_stored(6, scores + 32, SCORE_ROW);
  if (nc > 3) _tile_stored(7, scores + 48, SCORE_ROW);
  compiler_barrier();
}

// acc[r] = acc[r] * factor[r] + sum over the tile's first 32 * steps (1 or
// 2) keys of probs[r * TILE + t] * value t, for the first n of 16 rows. The tile's
// sum starts from zero in fresh C tiles, 64 dims at a time, and joins the
// float32 accumulators in AVX-512: a tile cannot be rescaled in place.
template <int HEAD_DIM>
inline void amx_weigh_tile(const uint16_t *probs, const uint16_t *values, int steps,
                           int n, const float *factor, float *acc) {
  constexpr int64_t PROB_ROW = TILE * 2, VALUE_ROW = HEAD_DIM * 4;
  alignas(64) float sum[AMX_ROWS][64];
  compiler_barrier();
  for (int d0 = 0; d0 < HEAD_DIM; d0 += 64) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int s = 0; s < steps; ++s) {
      const uint16_t *v = values + s * AMX_DEPTH * HEAD_DIM + d0 * 2;  // key pair 16 * s
      _tile_loadd(0, probs + s * AMX_DEPTH, PROB_ROW);
      _tile_loadd(2, v, VALUE_ROW);
      _tile_dpbf16ps(4, 0, 2);
      _tile_loadd(3, v + 32, VALUE_ROW);
      _tile_dpbf16ps(5, 0, 3);
      _tile_loadd(2, v + 64, VALUE_ROW);
      _tile_dpbf16ps(6, 0, 2);
      _tile_loadd(3, v + 96, VALUE_ROW);
      _tile_dpbf16ps(7, 0, 3);
    }
    _tile_stored(4, sum[0], sizeof sum[0]);
    _tile_stored(5, sum[0] + 16, sizeof sum[0]);
    _tile_stored(6, sum[0] + 32, sizeof sum[0]);
    _tile_stored(7, sum[0] + 48, sizeof sum[0]);
    compiler_barrier();
    for (int r = 0; r < n; ++r) {
      const __m512 f = _mm512_set1_ps(factor[r]);
      float *o = acc + r * HEAD_DIM + d0;
      for (int c = 0; c < 4; ++c)
        _mm512_storeu_ps(o + c * 16, _mm512_fmadd_ps(_mm512_loadu_ps(o + c * 16), f,
                                                     _mm512_load_ps(sum[r] + c * 16)));
    }
  }
}

}  // namespace prefill
