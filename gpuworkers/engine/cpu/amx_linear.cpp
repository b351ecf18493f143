// y = x @ W.T (+ b) in bfloat16 on AMX, for any number of rows. Where the
// build has no AMX the entry points report themselves unavailable and
// oneDNN (packing.py) runs every linear.
//
// Why not oneDNN here: a decode step's linears stream every weight once
// for a few rows (the demo model reads 268 MB of them per step for ~24
// rows), and oneDNN's bfloat16 matmul read them at 15-18 GB/s on 2 cores
// (8-9 GB/s for the small o, q/k/v and down matrices) where the memory
// gives ~29 GB/s. Here each thread streams one contiguous run of the
// weights, packed so that a 1 KB AMX tile (16 output columns x 32 inputs)
// is one contiguous load, and every tile feeds all rows of a 32-row block;
// larger calls loop over row blocks inside each pair of column tiles, whose
// weights stay in L1/L2 meanwhile. And oneDNN's row bits vary with the row
// count (on the Intel test machine, gate/up rows differed between 17 and
// 300 rows), so a prompt computed whole and the same prompt's tail after a
// prefix-cache hit could sample different greedy tokens; here they cannot.
// AVX512_BF16 was tried first: vdpbf16ps ran at one per ~0.5 ns on that
// Xeon (FMA: 0.09 ns), so 24 rows made it compute-bound and 2-4x slower
// than oneDNN; AMX does the arithmetic for 16 rows per instruction.
//
// Arithmetic: each output is the float32 accumulation, in k order 32
// inputs at a time, of exact bf16 products (tdpbf16ps), plus the bias in
// float32, rounded to nearest even bfloat16. Each output element is its
// own dot product: a row's bits depend on its inputs only, never on how
// many rows share the call or the thread count.

#include <algorithm>
#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>

#include "amx_tiles.h"
#include "elementwise_avx512.h"

namespace {

constexpr int TILE_ROWS = 16;     // rows of x per A tile
constexpr int TILE_COLS = 16;     // output columns per B / C tile
constexpr int TILE_K = 32;        // inputs per tile step (64 bytes of bf16)
constexpr int MAX_ROWS = 2 * TILE_ROWS;  // rows per block: two row tiles

using amx::amx_permitted;
using amx::TileConfig;

// count (<= 16) float32 values as bfloat16, rounded as the element-wise
// kernels round (nearest even, subnormals kept, NaN kept NaN).
inline void store_bf16(uint16_t *dst, __m512 v, int64_t count) {
  const __mmask16 keep = count >= 16 ? 0xffff : static_cast<__mmask16>((1u << count) - 1);
  _mm512_mask_cvtepi32_storeu_epi16(dst, keep, _mm512_srli_epi32(elementwise::avx512::round_bits(v), 16));
}

// Tiles: 0, 1 = x rows 0-15 and 16-31; 2, 3 = weights of two column tiles;
// 4, 5 = rows 0-15 x those columns; 6, 7 = rows 16-31 x those columns.
TileConfig config_for(int rows) {
  TileConfig c;
  const int low = rows < TILE_ROWS ? rows : TILE_ROWS, high = rows - low;
  c.rows[0] = low, c.colsb[0] = 64;
  c.rows[1] = high, c.colsb[1] = high ? 64 : 0;
  for (int t : {2, 3}) c.rows[t] = TILE_K / 2, c.colsb[t] = 64;
  for (int t : {4, 5}) c.rows[t] = low, c.colsb[t] = 64;
  for (int t : {6, 7}) c.rows[t] = high, c.colsb[t] = high ? 64 : 0;
  return c;
}

// Output columns [16 * tile, 16 * tile + 32) (or 16 for a last odd tile).
template <bool HIGH, bool PAIR>
void column_tiles(const uint16_t *x, int64_t x_bytes, const uint16_t *w0, const uint16_t *w1,
                  int64_t steps, float *c) {
  _tile_zero(4);
  if constexpr (PAIR) _tile_zero(5);
  if constexpr (HIGH) {
    _tile_zero(6);
    if constexpr (PAIR) _tile_zero(7);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(0, x + s * TILE_K, x_bytes);
    if constexpr (HIGH) _tile_loadd(1, x + TILE_ROWS * x_bytes / 2 + s * TILE_K, x_bytes);
    _tile_loadd(2, w0 + s * TILE_K * TILE_COLS, 64);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (HIGH) _tile_dpbf16ps(6, 1, 2);
    if constexpr (PAIR) {
      _tile_loadd(3, w1 + s * TILE_K * TILE_COLS, 64);
      _tile_dpbf16ps(5, 0, 3);
      if constexpr (HIGH) _tile_dpbf16ps(7, 1, 3);
    }
  }
  // c: [32 rows][32 columns] float32.
  constexpr int64_t STRIDE = 2 * TILE_COLS * sizeof(float);
  _tile_stored(4, c, STRIDE);
  if constexpr (PAIR) _tile_stored(5, c + TILE_COLS, STRIDE);
  if constexpr (HIGH) {
    _tile_stored(6, c + TILE_ROWS * 2 * TILE_COLS, STRIDE);
    if constexpr (PAIR) _tile_stored(7, c + TILE_ROWS * 2 * TILE_COLS + TILE_COLS, STRIDE);
  }
}

// One block of up to 32 rows against the column tiles of `pair`.
inline void block_pair(const uint16_t *x, int64_t x_bytes, int64_t rows, const uint16_t *packed,
                       int64_t tile_elems, int64_t tiles, int64_t pair, int64_t steps,
                       const float *bias, uint16_t *out, int64_t out_features, float *c) {
  const int64_t t = 2 * pair;
  const bool both = t + 1 < tiles, high = rows > TILE_ROWS;
  const uint16_t *w0 = packed + t * tile_elems, *w1 = w0 + tile_elems;
  if (high)
    both ? column_tiles<true, true>(x, x_bytes, w0, w1, steps, c)
         : column_tiles<true, false>(x, x_bytes, w0, w1, steps, c);
  else
    both ? column_tiles<false, true>(x, x_bytes, w0, w1, steps, c)
         : column_tiles<false, false>(x, x_bytes, w0, w1, steps, c);
  const int64_t first = t * TILE_COLS;
  const int64_t columns = std::min<int64_t>(out_features - first, both ? 2 * TILE_COLS : TILE_COLS);
  for (int64_t r = 0; r < rows; ++r) {
    const float *acc = c + r * 2 * TILE_COLS;
    uint16_t *dst = out + r * out_features + first;
    for (int64_t j = 0; j < columns; j += 16) {
      const int64_t n = columns - j < 16 ? columns - j : 16;
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      __m512 v = _mm512_loadu_ps(acc + j);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + first + j));
      store_bf16(dst + j, v, n);
    }
  }
}

}  // namespace

extern "C" {

int amx_linear_supported() { return amx_permitted() ? 1 : 0; }

int amx_linear_k_multiple() { return TILE_K; }

// x [rows][in] bf16 (row stride x_stride elements; in a multiple of
// 32); packed: the weight [out][in] as [ceil(out / 16)][in / 2][16][2]
// bf16, columns past `out` zero; bias float32 [out] or null; out
// [rows][out] bf16, contiguous.
void amx_linear_bf16(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                     const uint16_t *packed, const float *bias, uint16_t *out,
                     int64_t out_features) {
  const int64_t steps = in_features / TILE_K;
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  const int64_t pairs = (tiles + 1) / 2;
  const int64_t tile_elems = in_features * TILE_COLS;
  const int64_t x_bytes = x_stride * 2;
  const int64_t full = rows / MAX_ROWS, tail = rows % MAX_ROWS;
  const TileConfig full_config = config_for(MAX_ROWS), tail_config = config_for(static_cast<int>(tail));
  // Column tiles in pairs, split statically: each thread streams one
  // contiguous run of the packed weights, and every row block of a pair
  // reads its weights from cache after the first.
#pragma omp parallel
  {
    alignas(64) float c[MAX_ROWS * 2 * TILE_COLS];
    if (full) {
      _tile_loadconfig(&full_config);
#pragma omp for schedule(static) nowait
      for (int64_t pair = 0; pair < pairs; ++pair)
        for (int64_t b = 0; b < full; ++b)
          block_pair(x + b * MAX_ROWS * x_stride, x_bytes, MAX_ROWS, packed, tile_elems, tiles, pair,
                     steps, bias, out + b * MAX_ROWS * out_features, out_features, c);
    }
    if (tail) {
      _tile_loadconfig(&tail_config);
#pragma omp for schedule(static)
      for (int64_t pair = 0; pair < pairs; ++pair)
        block_pair(x + full * MAX_ROWS * x_stride, x_bytes, tail, packed, tile_elems, tiles, pair,
                   steps, bias, out + full * MAX_ROWS * out_features, out_features, c);
    }
    _tile_release();
  }
}

}  // extern "C"

#else  // no AMX at build time

extern "C" {
int amx_linear_supported() { return 0; }
int amx_linear_k_multiple() { return 0; }
void amx_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t) {}
}

#endif
