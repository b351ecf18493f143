// y = x @ W.T (+ b) in bfloat16 for the few rows of a decode step, on AMX.
// Where the build has no AMX the entry points report themselves
// unavailable and oneDNN runs every linear.
//
// Why not oneDNN for these rows: a decode step's linears are a stream over
// the weights (the demo model reads 268 MB of them per step for ~24 rows),
// and oneDNN's bfloat16 matmul read them at 15-18 GB/s on 2 cores (8-9
// GB/s for the small o, q/k/v and down matrices), where the memory gives
// ~29 GB/s. Here each thread streams one contiguous run of the weights,
// packed so that a 1 KB AMX tile (16 output columns x 32 inputs) is one
// contiguous load, and every tile feeds all rows (up to 32: two row tiles).
// AVX512_BF16 was tried first: vdpbf16ps ran at one per ~0.5 ns on this
// machine's Xeon (FMA: 0.09 ns), so 24 rows made it compute-bound and 2-4x
// slower than oneDNN; AMX does the arithmetic for 16 rows per instruction.
//
// Arithmetic: each output is the float32 accumulation, in k order 32
// inputs at a time, of exact bf16 products (tdpbf16ps), plus the bias in
// float32, rounded to nearest even bfloat16. Each output element is its
// own dot product: a row's bits depend on its inputs only, never on how
// many rows share the call or the thread count. They are not oneDNN's.

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int TILE_ROWS = 16;     // rows of x per A tile
constexpr int TILE_COLS = 16;     // output columns per B / C tile
constexpr int TILE_K = 32;        // inputs per tile step (64 bytes of bf16)
constexpr int MAX_ROWS = 2 * TILE_ROWS;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands AMX state to a thread only after the process asks once.
bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return permitted;
}

// count (<= 16) float32 values as bfloat16, rounded to nearest even as
// torch's cast does (not vcvtneps2bf16, which flushes subnormals), NaN
// kept NaN.
inline void store_bf16(uint16_t *dst, __m512 v, int64_t count) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  // A class test, not a compare: -ffast-math lets gcc assume no NaN there.
  const __mmask16 nan = _mm512_fpclass_ps_mask(v, 0x81);
  rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000));
  const __mmask16 keep = count >= 16 ? 0xffff : static_cast<__mmask16>((1u << count) - 1);
  _mm512_mask_cvtepi32_storeu_epi16(dst, keep, _mm512_srli_epi32(rounded, 16));
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

}  // namespace

extern "C" {

int decode_linear_supported() { return amx_permitted() ? 1 : 0; }

int decode_linear_max_rows() { return MAX_ROWS; }

int decode_linear_k_multiple() { return TILE_K; }

// x [rows <= 32][in] bf16 (row stride x_stride elements; in a multiple of
// 32); packed: the weight [out][in] as [ceil(out / 16)][in / 2][16][2]
// bf16, columns past `out` zero; bias float32 [out] or null; out
// [rows][out] bf16, contiguous.
void decode_linear_bf16(const uint16_t *x, int64_t rows, int64_t x_stride, int64_t in_features,
                        const uint16_t *packed, const float *bias, uint16_t *out,
                        int64_t out_features) {
  const int64_t steps = in_features / TILE_K;
  const int64_t tiles = (out_features + TILE_COLS - 1) / TILE_COLS;
  const int64_t tile_elems = in_features * TILE_COLS;  // one column tile's packed weights
  const int64_t x_bytes = x_stride * 2;
  const TileConfig config = config_for(static_cast<int>(rows));
  const bool high = rows > TILE_ROWS;
  // Column tiles in pairs, split statically: each thread streams one
  // contiguous run of the packed weights.
#pragma omp parallel
  {
    _tile_loadconfig(&config);
    alignas(64) float c[MAX_ROWS * 2 * TILE_COLS];
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < (tiles + 1) / 2; ++pair) {
      const int64_t t = 2 * pair;
      const bool both = t + 1 < tiles;
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
    _tile_release();
  }
}

}  // extern "C"

#else  // no AMX at build time

extern "C" {
int decode_linear_supported() { return 0; }
int decode_linear_max_rows() { return 0; }
int decode_linear_k_multiple() { return 0; }
void decode_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t) {}
}

#endif
