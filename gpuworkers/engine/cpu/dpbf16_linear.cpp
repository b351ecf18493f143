// y = x @ W.T (+ b) in bfloat16 with AVX512_BF16's vdpbf16ps, for any
// number of rows: the linears of CPUs without AMX but with AVX512_BF16
// (AMD EPYC Zen 4). Where the build has neither, the entry points report
// themselves unavailable and oneDNN (packing.py) runs every linear.
//
// Why not oneDNN here: on the 2-core AMD EPYC test machine a vdpbf16ps
// issues once per ~0.29 ns per core (450 GFLOP/s for two cores, a loop of
// independent instructions), and oneDNN's bfloat16 matmul reached ~190
// GFLOP/s at a decode step's 24 rows. There the linears are compute-bound,
// not memory-bound (the demo model's 268 MB of weights take ~7 ms at 39
// GB/s), so what counts is keeping the FMA unit busy: 24 accumulators (12
// rows x 2 column vectors) take each loaded weight vector 12 times and
// each broadcast input pair twice, and the next weights are prefetched
// while the current ones serve every row block. `python -m
// bench.decode_linear`: 0.6-0.75x oneDNN's time for 4-24 rows, and
// 1.0-1.1x for prompts' 384-1024 rows (noisy; oneDNN blocks larger
// prompts better). One kernel for all rows keeps one copy of the weights
// and rows whose bits do not depend on the batch; the in-process serving
// workload (`bench.serving_engine`) made 254-274 output tok/s against
// oneDNN's 232 (GPUWORKERS_TILE_LINEARS=0), alternating.
//
// The weights are packed as for AMX (tile_linear.py's pack_tiles): a column
// tile's 16 columns x 2 inputs per input pair are one 64-byte vector,
// exactly vdpbf16ps's operand. And, as there, each output is its own dot
// product: a row's bits depend on its inputs only, never on how many rows
// share the call or the thread count.
//
// Arithmetic: each output is the float32 accumulation, in input order two
// inputs at a time, of bf16 products (vdpbf16ps: the pair's sum rounded
// to float32, nearest even, subnormal inputs and outputs flushed to zero
// whatever MXCSR says), plus the bias in float32, rounded to nearest even
// bfloat16 (linear_epilogue.h).
//
// The int8 entry points (dpbf16_linear_int8, dpbf16_swiglu_int8) run the
// same blocks on weights kept as int8 (int8_weights.h): each thread widens
// a chunk to bfloat16 (exactly) while the next chunk's int8 weights are
// prefetched, and the epilogue multiplies each column by its scale.

#include <algorithm>
#include <cstdint>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#include <immintrin.h>
#include <omp.h>

#include <cstring>
#include <utility>

#include "int8_weights.h"
#include "linear_epilogue.h"

namespace {

using linear_epilogue::finish_rows;
using linear_epilogue::Pending;
using linear_epilogue::TILE_COLS;

// Rows per block: 12 rows x 2 column vectors of float32 sums, the two
// weight vectors and a broadcast fill 27 of the 32 zmm registers.
constexpr int MAX_ROWS = 12;
// Weights per chunk of column pairs (at least one pair: 36 KB at 576
// inputs), which every row block runs over while the next chunk is
// prefetched. Small, so that prefetching starts early in each call: a
// thread's share of o or q/k/v is 0.3-0.6 MB. With 384 KB chunks 24 rows
// took 0.83x oneDNN's time (`python -m bench.decode_linear --rows 24`, min
// of 3 runs), with 64 KB 0.73x.
constexpr int64_t CHUNK_BYTES = 64 << 10;

// Rows [0, R) of x against the column tiles at w0 (and w1 if PAIR) over
// `pairs` input pairs: sums [R][32] float32 (columns 16-31 unset without
// PAIR). Meanwhile `prefetch_lines` cache lines from `prefetch` on are
// asked into L2, up to two per input pair.
template <int R, bool PAIR>
void block(const uint16_t *x, int64_t x_stride, const uint16_t *w0, const uint16_t *w1,
           int64_t pairs, float *sums, const char *prefetch, int64_t prefetch_lines) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    if (2 * p < prefetch_lines) _mm_prefetch(prefetch + 2 * p * 64, _MM_HINT_T1);
    if (2 * p + 1 < prefetch_lines) _mm_prefetch(prefetch + (2 * p + 1) * 64, _MM_HINT_T1);
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(w0 + p * 2 * TILE_COLS);
    const __m512bh b1 = PAIR ? (__m512bh)_mm512_loadu_si512(w1 + p * 2 * TILE_COLS) : b0;
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      int32_t pair_bits;
      std::memcpy(&pair_bits, x + r * x_stride + 2 * p, sizeof pair_bits);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair_bits);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], a, b0);
      if constexpr (PAIR) acc1[r] = _mm512_dpbf16_ps(acc1[r], a, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(sums + r * 2 * TILE_COLS, acc0[r]);
    if constexpr (PAIR) _mm512_store_ps(sums + r * 2 * TILE_COLS + TILE_COLS, acc1[r]);
  }
}

using BlockFn = void (*)(const uint16_t *, int64_t, const uint16_t *, const uint16_t *, int64_t,
                         float *, const char *, int64_t);

template <int... R>
constexpr auto block_table(std::integer_sequence<int, R...>) {
  struct Table {
    BlockFn pair[MAX_ROWS + 1], single[MAX_ROWS + 1];
  };
  return Table{{nullptr, block<R + 1, true>...}, {nullptr, block<R + 1, false>...}};
}

constexpr auto BLOCKS = block_table(std::make_integer_sequence<int, MAX_ROWS>{});

struct Linear {
  const uint16_t *x;
  int64_t x_stride, pairs;  // input pairs per row
  const uint16_t *packed;   // bfloat16 weights, or null with int8 ones
  const int8_t *quantized;  // int8 weights in the same layout, or null
  const float *scales;      // per column with int8 weights (tile order)
  int64_t tile_elems, tiles;
  const float *bias;
  uint16_t *out;
  int64_t out_features;  // out's row stride: the columns, or the gated width
  bool swiglu;           // tiles alternate gate and up (dpbf16_swiglu_bf16)
};

// Rows [row, row + rows) (rows <= 12) against column pair `pair`, whose
// bfloat16 tiles start at w0, rounded into the output; prefetching as
// `block` does.
inline void block_pair(const Linear &l, int64_t row, int64_t rows, int64_t pair,
                       const uint16_t *w0, float *sums, const char *prefetch,
                       int64_t prefetch_lines) {
  const int64_t t = 2 * pair;
  const bool both = t + 1 < l.tiles;
  (both ? BLOCKS.pair : BLOCKS.single)[rows](l.x + row * l.x_stride, l.x_stride, w0,
                                             w0 + l.tile_elems, l.pairs, sums, prefetch,
                                             prefetch_lines);
  if (l.swiglu) {
    finish_rows({sums, rows, 0xffff, nullptr, l.out + row * l.out_features + pair * TILE_COLS,
                 l.out_features, true, l.scales ? l.scales + pair * 2 * TILE_COLS : nullptr},
                0, rows);
    return;
  }
  const int64_t first = t * TILE_COLS;
  const int64_t columns = std::min<int64_t>(l.out_features - first, both ? 2 * TILE_COLS : TILE_COLS);
  finish_rows({sums, rows, static_cast<__mmask32>((uint64_t{1} << columns) - 1),
               l.bias ? l.bias + first : nullptr, l.out + row * l.out_features + first,
               l.out_features, false, l.scales ? l.scales + first : nullptr},
              0, rows);
}

// Column pairs split statically over the threads (each streams one
// contiguous run of the packed weights), in chunks that stay in L2 while
// every row block runs over them. Row blocks are as even as they can be
// (24 rows: 12 + 12, not 12 + 12 + 0; 16: 8 + 8, not 12 + 4): a small
// block has too few accumulators to hide vdpbf16ps's latency.
//
// While a chunk's blocks run, the next chunk is prefetched into L2, spread
// evenly over them: otherwise the first block over a chunk waits on DRAM
// (12 rows of a decode step need ~37 GB/s of weights to keep two cores'
// FMA units busy) and the later blocks leave DRAM idle.
void run(const Linear &l, int64_t rows) {
  const int64_t pairs = (l.tiles + 1) / 2;
  const int64_t blocks = (rows + MAX_ROWS - 1) / MAX_ROWS;
  // Bytes per weight in memory: what prefetching streams.
  const int64_t size = l.quantized ? 1 : 2;
  const int64_t pair_bytes = 2 * l.tile_elems * size;
  const int64_t weight_bytes = l.tiles * l.tile_elems * size;  // the last tile may be single
  // Chunks of the same number of weights either way (CHUNK_BYTES of bfloat16).
  const int64_t chunk = std::max<int64_t>(1, CHUNK_BYTES / (2 * l.tile_elems * 2));
#pragma omp parallel
  {
    alignas(64) float sums[MAX_ROWS * 2 * TILE_COLS];
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t end = pairs * (me + 1) / threads;
    const char *stored = l.quantized ? reinterpret_cast<const char *>(l.quantized)
                                     : reinterpret_cast<const char *>(l.packed);
    uint16_t *widened = l.quantized ? int8_weights::buffer(chunk * 2 * l.tile_elems) : nullptr;
    for (int64_t start = pairs * me / threads; start < end; start += chunk) {
      const int64_t stop = std::min(end, start + chunk);
      // The chunk's bfloat16 tiles: the packed weights, or its int8 ones
      // widened (the last pair may have one tile).
      const uint16_t *weights = widened;
      if (l.quantized)
        int8_weights::widen(l.quantized + 2 * start * l.tile_elems, widened,
                            (std::min(2 * stop, l.tiles) - 2 * start) * l.tile_elems);
      else
        weights = l.packed + 2 * start * l.tile_elems;
      // The next chunk's cache lines, in equal shares per block x pair call.
      const int64_t next_end = std::min(end, stop + chunk);
      const int64_t next_bytes =
          std::max<int64_t>(0, std::min(next_end * pair_bytes, weight_bytes) - stop * pair_bytes);
      const int64_t lines = next_bytes / 64, calls = blocks * (stop - start);
      int64_t call = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t first = rows * b / blocks, last = rows * (b + 1) / blocks;
        for (int64_t pair = start; pair < stop; ++pair, ++call) {
          const int64_t from = lines * call / calls, to = lines * (call + 1) / calls;
          block_pair(l, first, last - first, pair, weights + 2 * (pair - start) * l.tile_elems,
                     sums, stored + stop * pair_bytes + from * 64, to - from);
        }
      }
    }
  }
}

}  // namespace

extern "C" {

int dpbf16_linear_supported() { return 1; }

int dpbf16_linear_k_multiple() { return 2; }  // inputs per vdpbf16ps lane

// x [rows][in] bf16 (row stride x_stride elements; in even); packed: the
// weight [out][in] as [ceil(out / 16)][in / 2][16][2] bf16, columns past
// `out` zero; bias float32 [out] or null; out [rows][out] bf16, contiguous.
void dpbf16_linear_bf16(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                        const uint16_t *packed, const float *bias, uint16_t *out,
                        int64_t out_features) {
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  run({x, x_stride, in_features / 2, packed, nullptr, nullptr, in_features * TILE_COLS, tiles, bias,
       out, out_features, false},
      rows);
}

// out [rows][width] = silu(gate) * up for a gate_up linear [2 * width][in]
// without bias, packed as above with its gate and up column tiles
// alternating (gate 0, up 0, gate 1, ...); width a multiple of 16.
void dpbf16_swiglu_bf16(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                        const uint16_t *packed, uint16_t *out, int64_t width) {
  run({x, x_stride, in_features / 2, packed, nullptr, nullptr, in_features * TILE_COLS,
       2 * width / TILE_COLS, nullptr, out, width, true},
      rows);
}

// As dpbf16_linear_bf16 with int8 weights `quantized` (packed as above, one
// byte each) and float32 `scales` [out]: out = (x @ q.T) * scales + bias.
void dpbf16_linear_int8(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                        const int8_t *quantized, const float *scales, const float *bias,
                        uint16_t *out, int64_t out_features) {
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  run({x, x_stride, in_features / 2, nullptr, quantized, scales, in_features * TILE_COLS, tiles,
       bias, out, out_features, false},
      rows);
}

// As dpbf16_swiglu_bf16 with int8 weights; `scales` [2 * width] in the
// tiles' alternating order (gate 0's 16, up 0's 16, gate 1's, ...).
void dpbf16_swiglu_int8(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                        const int8_t *quantized, const float *scales, uint16_t *out,
                        int64_t width) {
  run({x, x_stride, in_features / 2, nullptr, quantized, scales, in_features * TILE_COLS,
       2 * width / TILE_COLS, nullptr, out, width, true},
      rows);
}

}  // extern "C"

#else  // no AVX512_BF16 at build time

extern "C" {
int dpbf16_linear_supported() { return 0; }
int dpbf16_linear_k_multiple() { return 0; }
void dpbf16_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t) {}
void dpbf16_swiglu_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, uint16_t *,
                        int64_t) {}
void dpbf16_linear_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                        const float *, uint16_t *, int64_t) {}
void dpbf16_swiglu_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                        uint16_t *, int64_t) {}
}

#endif
