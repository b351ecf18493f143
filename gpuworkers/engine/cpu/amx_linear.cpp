// y = x @ W.T (+ b) in bfloat16 on AMX, for any number of rows. Where the
// build has no AMX the entry points report themselves unavailable and
// dpbf16_linear.cpp (AVX512_BF16) or oneDNN (packing.py) runs the linears.
//
// Why not oneDNN here: a decode step's linears stream every weight once
// for a few rows (the demo model reads 268 MB of them per step for ~24
// rows), and oneDNN's bfloat16 matmul read them at 15-18 GB/s on 2 cores
// (8-9 GB/s for the small o, q/k/v and down matrices) where the memory
// gives ~29 GB/s. Here each thread streams one contiguous run of the
// weights, packed so that a 1 KB AMX tile (16 output columns x 32 inputs)
// is one contiguous load, and every tile feeds all rows of a 32-row block.
// Larger calls (prompts) take the weights in chunks that stay in L2 while
// every 32-row block runs over them, so each block's rows stay in L1; and
// the vector units round one block's sums to bfloat16 while AMX computes
// the next: rounding after the tiles left AMX idle for about a third of a
// prompt's time. And oneDNN's row bits vary with the row count (on the
// Intel test machine, gate/up rows differed between 17 and 300 rows), so
// a prompt computed whole and the same prompt's tail after a prefix-cache
// hit could sample different greedy tokens; here they cannot.
// AVX512_BF16 was tried first: vdpbf16ps ran at one per ~0.5 ns on that
// Xeon (FMA: 0.09 ns), so 24 rows made it compute-bound and 2-4x slower
// than oneDNN; AMX does the arithmetic for 16 rows per instruction.
//
// Arithmetic: each output is the float32 accumulation, in k order 32
// inputs at a time, of exact bf16 products (tdpbf16ps), plus the bias in
// float32, rounded to nearest even bfloat16. Each output element is its
// own dot product: a row's bits depend on its inputs only, never on how
// many rows share the call or the thread count.
//
// The int8 entry points (amx_linear_int8, amx_swiglu_int8) run the same
// tiles on weights kept as int8 (int8_weights.h), widened exactly to
// bfloat16: the tiles sum x times the integer weights, and the epilogue
// multiplies each column by its scale before the bias. Up to 64 rows (a
// decode step) each k step's tiles are widened just before their loads,
// so that the int8 weights stream from DRAM while AMX works (widening a
// chunk into L2 first and then running the tiles over it was slower than
// bfloat16 weights: the phases did not overlap); more rows widen a chunk
// per thread first, which all their row blocks share.

#include <algorithm>
#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <omp.h>

#include "amx_tiles.h"
#include "int8_weights.h"
#include "linear_epilogue.h"

namespace {

constexpr int TILE_ROWS = 16;     // rows of x per A tile
constexpr int TILE_COLS = 16;     // output columns per B / C tile
constexpr int TILE_K = 32;        // inputs per tile step (64 bytes of bf16)
constexpr int MAX_ROWS = 2 * TILE_ROWS;  // rows per block: two row tiles
// Weights per chunk of column pairs: well inside a core's L2 (2 MB on
// Sapphire Rapids) next to the rows.
constexpr int64_t CHUNK_BYTES = 512 << 10;
constexpr int64_t PER_STEP_ROWS = 2 * MAX_ROWS;

using amx::amx_permitted;
using amx::TileConfig;
using linear_epilogue::finish_rows;
using linear_epilogue::Pending;

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

// One row block against one pair of column tiles (or a last odd tile):
// sums into `sums` ([32 rows][32 columns] float32). Meanwhile the vector
// units round the previous pair's rows, a slice per k step: done after
// the tiles, that rounding left AMX idle for about a third of the time.
//
// WIDEN: w0 and w1 are int8 tiles, each k step's widened into `staging`
// just before its tile loads: a decode step's row block streams the int8
// weights straight from DRAM, with no pass through a chunk buffer in L2.
// Without `keep`, staging holds two steps ([2][2][32 x 16] bfloat16, in
// L1); with it, the pair's whole widened tiles ([2][steps x 32 x 16], as
// the bfloat16 packing), which the call's other row blocks then read.
template <bool HIGH, bool PAIR, bool WIDEN>
void column_tiles(const uint16_t *x, int64_t x_bytes, const void *w0, const void *w1,
                  int64_t steps, float *sums, const Pending &previous, uint16_t *staging,
                  bool keep) {
  constexpr int64_t TILE_ELEMS = TILE_K * TILE_COLS;
  _tile_zero(4);
  if constexpr (PAIR) _tile_zero(5);
  if constexpr (HIGH) {
    _tile_zero(6);
    if constexpr (PAIR) _tile_zero(7);
  }
  int64_t finished = 0;
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(0, x + s * TILE_K, x_bytes);
    if constexpr (HIGH) _tile_loadd(1, x + TILE_ROWS * x_bytes / 2 + s * TILE_K, x_bytes);
    const uint16_t *b0, *b1;
    if constexpr (WIDEN) {
      uint16_t *stage0 = keep ? staging + s * TILE_ELEMS : staging + (s & 1) * 2 * TILE_ELEMS;
      uint16_t *stage1 = keep ? stage0 + steps * TILE_ELEMS : stage0 + TILE_ELEMS;
      int8_weights::widen(static_cast<const int8_t *>(w0) + s * TILE_ELEMS, stage0, TILE_ELEMS);
      if constexpr (PAIR)
        int8_weights::widen(static_cast<const int8_t *>(w1) + s * TILE_ELEMS, stage1, TILE_ELEMS);
      amx::compiler_barrier();  // the stores before the tile loads
      b0 = stage0, b1 = stage1;
    } else {
      b0 = static_cast<const uint16_t *>(w0) + s * TILE_ELEMS;
      b1 = static_cast<const uint16_t *>(w1) + s * TILE_ELEMS;
    }
    _tile_loadd(2, b0, 64);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (HIGH) _tile_dpbf16ps(6, 1, 2);
    if constexpr (PAIR) {
      _tile_loadd(3, b1, 64);
      _tile_dpbf16ps(5, 0, 3);
      if constexpr (HIGH) _tile_dpbf16ps(7, 1, 3);
    }
    if constexpr (WIDEN) amx::compiler_barrier();  // the loads before the next stores
    const int64_t until = previous.rows * (s + 1) / steps;
    finish_rows(previous, finished, until);
    finished = until;
  }
  constexpr int64_t STRIDE = 2 * TILE_COLS * sizeof(float);
  _tile_stored(4, sums, STRIDE);
  if constexpr (PAIR) _tile_stored(5, sums + TILE_COLS, STRIDE);
  if constexpr (HIGH) {
    _tile_stored(6, sums + TILE_ROWS * 2 * TILE_COLS, STRIDE);
    if constexpr (PAIR) _tile_stored(7, sums + TILE_ROWS * 2 * TILE_COLS + TILE_COLS, STRIDE);
  }
  amx::compiler_barrier();  // finish_rows reads these sums later
}

struct Linear {
  const uint16_t *x;
  int64_t x_stride, steps;
  const uint16_t *packed;  // bfloat16 weights, or null with int8 ones
  const int8_t *quantized;  // int8 weights in the same layout, or null
  const float *scales;      // per column with int8 weights (tile order)
  int64_t tile_elems, tiles;
  const float *bias;
  uint16_t *out;
  int64_t out_features;  // out's row stride: the columns, or the gated width
  bool swiglu;           // tiles alternate gate and up (amx_swiglu_bf16)
};

template <bool WIDEN, typename Weight>
inline void run_tiles(bool high, bool both, const uint16_t *x, int64_t x_bytes, const Weight *w0,
                      int64_t tile_elems, int64_t steps, float *sums, const Pending &previous,
                      uint16_t *staging, bool keep) {
  const Weight *w1 = w0 + tile_elems;
  if (high)
    both ? column_tiles<true, true, WIDEN>(x, x_bytes, w0, w1, steps, sums, previous, staging, keep)
         : column_tiles<true, false, WIDEN>(x, x_bytes, w0, w1, steps, sums, previous, staging,
                                            keep);
  else
    both ? column_tiles<false, true, WIDEN>(x, x_bytes, w0, w1, steps, sums, previous, staging,
                                            keep)
         : column_tiles<false, false, WIDEN>(x, x_bytes, w0, w1, steps, sums, previous, staging,
                                             keep);
}

// Rows [row, row + rows) (rows <= 32) against column pair `pair`, whose
// tiles start at w0 (bfloat16), or at q0 (int8, widened as they go into
// `staging`, kept there with `keep`: then w0 is null), under the tile
// configuration for that row count. Returns the sums, pending.
inline Pending block_pair(const Linear &l, int64_t row, int64_t rows, int64_t pair,
                          const uint16_t *w0, const int8_t *q0, float *sums,
                          const Pending &previous, uint16_t *staging = nullptr,
                          bool keep = false) {
  const int64_t t = 2 * pair;
  const bool both = t + 1 < l.tiles, high = rows > TILE_ROWS;
  const uint16_t *x = l.x + row * l.x_stride;
  const int64_t x_bytes = l.x_stride * 2;
  if (w0)
    run_tiles<false>(high, both, x, x_bytes, w0, l.tile_elems, l.steps, sums, previous, staging,
                     keep);
  else
    run_tiles<true>(high, both, x, x_bytes, q0, l.tile_elems, l.steps, sums, previous, staging,
                    keep);
  if (l.swiglu)
    return {sums, rows, 0xffff, nullptr, l.out + row * l.out_features + pair * TILE_COLS,
            l.out_features, true, l.scales ? l.scales + pair * 2 * TILE_COLS : nullptr};
  const int64_t first = t * TILE_COLS;
  const int64_t columns = std::min<int64_t>(l.out_features - first, both ? 2 * TILE_COLS : TILE_COLS);
  return {sums, rows, static_cast<__mmask32>((uint64_t{1} << columns) - 1),
          l.bias ? l.bias + first : nullptr, l.out + row * l.out_features + first, l.out_features,
          false, l.scales ? l.scales + first : nullptr};
}

// Column pairs split statically over the threads: each thread streams
// one contiguous run of the packed weights.
void run(const Linear &l, int64_t rows) {
  const int64_t pairs = (l.tiles + 1) / 2;
  const int64_t full = rows / MAX_ROWS, tail = rows % MAX_ROWS;
  const TileConfig full_config = config_for(MAX_ROWS), tail_config = config_for(static_cast<int>(tail));
  // Pairs of column tiles per chunk: the chunk's weights stay in L2 while
  // every row block runs over them.
  const int64_t chunk = std::max<int64_t>(1, CHUNK_BYTES / (2 * l.tile_elems * 2));
#pragma omp parallel
  {
    // Two sum buffers: one pair's tiles fill one while the other is rounded.
    alignas(64) float sums[2][MAX_ROWS * 2 * TILE_COLS];
    Pending pending;
    int buffer = 0;
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t end = pairs * (me + 1) / threads;
    // Int8 weights, a few row blocks: each pair's tiles widened per k step
    // as the first block runs (column_tiles), kept for the other blocks;
    // more blocks: a chunk at a time, widened first, for all of them.
    const bool per_step = l.quantized && rows <= PER_STEP_ROWS;
    const bool keep = per_step && rows > MAX_ROWS;
    uint16_t *widened = !l.quantized || (per_step && !keep) ? nullptr
                        : int8_weights::buffer(keep ? 2 * l.tile_elems : chunk * 2 * l.tile_elems);
    alignas(64) uint16_t staging[2 * 2 * TILE_K * TILE_COLS];
    uint16_t *stage = keep ? widened : staging;
    if (per_step) {
      if (full) _tile_loadconfig(&full_config);
      for (int64_t pair = pairs * me / threads; pair < end; ++pair) {
        const int8_t *q0 = l.quantized + 2 * pair * l.tile_elems;
        if (tail && full) _tile_loadconfig(&full_config);
        // The first block widens (and with `keep` keeps) the pair's tiles.
        for (int64_t b = 0; b < full; ++b, buffer ^= 1)
          pending = b ? block_pair(l, b * MAX_ROWS, MAX_ROWS, pair, widened, nullptr, sums[buffer],
                                   pending)
                      : block_pair(l, 0, MAX_ROWS, pair, nullptr, q0, sums[buffer], pending, stage,
                                   keep);
        if (tail) _tile_loadconfig(&tail_config);
        if (tail && full)
          pending = block_pair(l, full * MAX_ROWS, tail, pair, widened, nullptr, sums[buffer],
                               pending),
          buffer ^= 1;
        else if (tail)
          pending = block_pair(l, 0, tail, pair, nullptr, q0, sums[buffer], pending, stage, false),
          buffer ^= 1;
      }
    }
    for (int64_t start = pairs * me / threads; !per_step && start < end; start += chunk) {
      const int64_t stop = std::min(end, start + chunk);
      // The chunk's bfloat16 tiles: the packed weights, or its int8 ones
      // widened (the last pair may have one tile).
      const uint16_t *weights = widened;
      if (l.quantized) {  // (the pending pair's sums are not in the buffer)
        // Tile loads are asm without a memory clobber: keep the last
        // chunk's before, and this chunk's after, the widening stores.
        amx::compiler_barrier();
        int8_weights::widen(l.quantized + 2 * start * l.tile_elems, widened,
                            (std::min(2 * stop, l.tiles) - 2 * start) * l.tile_elems);
        amx::compiler_barrier();
      } else {
        weights = l.packed + 2 * start * l.tile_elems;
      }
      if (full) _tile_loadconfig(&full_config);
      for (int64_t b = 0; b < full; ++b)
        for (int64_t pair = start; pair < stop; ++pair, buffer ^= 1)
          pending = block_pair(l, b * MAX_ROWS, MAX_ROWS, pair,
                               weights + 2 * (pair - start) * l.tile_elems, nullptr, sums[buffer],
                               pending);
      if (tail) _tile_loadconfig(&tail_config);
      for (int64_t pair = start; tail && pair < stop; ++pair, buffer ^= 1)
        pending = block_pair(l, full * MAX_ROWS, tail, pair,
                             weights + 2 * (pair - start) * l.tile_elems, nullptr, sums[buffer],
                             pending);
    }
    finish_rows(pending, 0, pending.rows);
    _tile_release();
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
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  run({x, x_stride, in_features / TILE_K, packed, nullptr, nullptr, in_features * TILE_COLS, tiles,
       bias, out, out_features, false},
      rows);
}

// out [rows][width] = silu(gate) * up for a gate_up linear [2 * width][in]
// without bias, packed as above with its gate and up column tiles
// alternating (gate 0, up 0, gate 1, ...); width a multiple of 16.
void amx_swiglu_bf16(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                     const uint16_t *packed, uint16_t *out, int64_t width) {
  run({x, x_stride, in_features / TILE_K, packed, nullptr, nullptr, in_features * TILE_COLS,
       2 * width / TILE_COLS, nullptr, out, width, true},
      rows);
}

// As amx_linear_bf16 with int8 weights `quantized` (packed as above, one
// byte each) and float32 `scales` [out]: out = (x @ q.T) * scales + bias.
void amx_linear_int8(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                     const int8_t *quantized, const float *scales, const float *bias,
                     uint16_t *out, int64_t out_features) {
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  run({x, x_stride, in_features / TILE_K, nullptr, quantized, scales, in_features * TILE_COLS,
       tiles, bias, out, out_features, false},
      rows);
}

// As amx_swiglu_bf16 with int8 weights; `scales` [2 * width] in the tiles'
// alternating order (gate 0's 16, up 0's 16, gate 1's, ...).
void amx_swiglu_int8(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                     const int8_t *quantized, const float *scales, uint16_t *out, int64_t width) {
  run({x, x_stride, in_features / TILE_K, nullptr, quantized, scales, in_features * TILE_COLS,
       2 * width / TILE_COLS, nullptr, out, width, true},
      rows);
}

}  // extern "C"

#else  // no AMX at build time

extern "C" {
int amx_linear_supported() { return 0; }
int amx_linear_k_multiple() { return 0; }
void amx_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t) {}
void amx_swiglu_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, uint16_t *,
                     int64_t) {}
void amx_linear_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                     const float *, uint16_t *, int64_t) {}
void amx_swiglu_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                     uint16_t *, int64_t) {}
}

#endif
