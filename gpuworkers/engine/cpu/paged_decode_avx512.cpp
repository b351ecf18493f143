// The paged decode kernel with AVX-512 intrinsics (paged_decode.cpp keeps
// the portable one, used where the compiler has no AVX-512).
//
// Why intrinsics: the portable kernel's score loop is one chain of 64
// dependent multiply-adds per query head and block (latency-bound, not
// memory-bound), and gcc picks 256-bit vectors on AMD. Here:
//   - the scores of a block are split into two interleaved chains (even
//     and odd dims), so the FMA units are fed while memory is read;
//   - bfloat16 -> float32 is a 16-bit shift of the zero-extended halves;
//   - exp is a vector polynomial, the softmax tail handled with masks;
//   - blocks PREFETCH_AHEAD ahead are prefetched (they sit anywhere in the
//     pool, where the hardware prefetcher cannot follow), and the first
//     value blocks while the last key blocks are scored.
//
// Rows that read the same blocks (RowGroup) are processed together: each
// key and value block is read from memory once and used by every row that
// needs it. Every row still runs its own arithmetic, in the same order as
// when it is alone (per block: its own accumulators, the same FMA
// sequence, its own softmax over its own length): a row's bits depend on
// its query and keys only, never on its group, the batch or the threads.

#include "paged_decode.h"

#ifdef __AVX512F__

#include <immintrin.h>
#include <math.h>

#include <algorithm>
#include <type_traits>
#include <cstring>

namespace paged {
namespace {

// Blocks are prefetched this far ahead into L2: one block's work is much
// shorter than a DRAM miss, and L2 tracks more misses in flight than L1
// (into L1, or 2 ahead, one core read ~9 GB/s from DRAM; this way ~15).
constexpr int PREFETCH_AHEAD = 4;

inline __m512 load16(const float *p) { return _mm512_loadu_ps(p); }
// bfloat16 is the top half of a float32.
inline __m512 load16(const uint16_t *p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline float load1(const uint16_t *p) {
  uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float load1(const float *p) { return *p; }

// Round to nearest even, as torch's float -> bfloat16 cast does (and as
// the portable kernel's store: not vcvtneps2bf16, which flushes subnormals).
inline void store1(uint16_t *p, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    *p = static_cast<uint16_t>((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *p = static_cast<uint16_t>(bits >> 16);
}
inline void store1(float *p, float f) { *p = f; }

inline void prefetch_span(const void *start, int64_t bytes) {
  const char *p = static_cast<const char *>(start);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T1);
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
// in registers.
constexpr int ACC_REGS = 24;
constexpr int MAX_TILE_ROWS = 4;

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

// Scores of block b's keys ([HEAD_DIM][BLOCK]) for R rows' GROUP heads,
// into row.score[g * padded + b * BLOCK + j]. Each key vector is loaded
// once for the R rows; each (row, head) keeps its own chains, so its bits
// do not depend on R or on the other rows.
template <typename T, int R, int GROUP, int HEAD_DIM, int BLOCK>
inline void score_rows(Row *const *rows, const T *keys, int64_t b) {
  constexpr int NB = BLOCK / 16;
  constexpr int SPLIT = score_split<GROUP, BLOCK>();
  __m512 acc[R][SPLIT][GROUP][NB];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < SPLIT; ++s)
      for (int g = 0; g < GROUP; ++g)
        for (int c = 0; c < NB; ++c) acc[r][s][g][c] = _mm512_setzero_ps();
  for (int d = 0; d < HEAD_DIM; d += SPLIT) {
    for (int s = 0; s < SPLIT; ++s) {
      __m512 key[NB];
      for (int c = 0; c < NB; ++c) key[c] = load16(keys + (d + s) * BLOCK + c * 16);
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < GROUP; ++g) {
          const __m512 qd = _mm512_set1_ps(rows[r]->query[g * HEAD_DIM + d + s]);
          for (int c = 0; c < NB; ++c)
            acc[r][s][g][c] = _mm512_fmadd_ps(qd, key[c], acc[r][s][g][c]);
        }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < GROUP; ++g)
      for (int c = 0; c < NB; ++c) {
        __m512 sum = acc[r][0][g][c];
        for (int s = 1; s < SPLIT; ++s) sum = _mm512_add_ps(sum, acc[r][s][g][c]);
        _mm512_storeu_ps(rows[r]->score + g * rows[r]->padded + b * BLOCK + c * 16, sum);
      }
}

template <int GROUP, int HEAD_DIM>
constexpr int weigh_tile_rows() {
  constexpr int rows = ACC_REGS / (HEAD_DIM / 16);
  return rows < 1 ? 1 : rows > MAX_TILE_ROWS ? MAX_TILE_ROWS : rows;
}

// row.acc[g][:] += sum over block b's value rows ([BLOCK][HEAD_DIM]) that
// the row sees, weighted by its softmax numerators, for R rows. Heads are
// tiled so the accumulators stay in registers (acc lives in memory
// between blocks and tiles, exactly); each (row, head) adds its values in
// token order whatever the tiling.
template <typename T, int R, int GROUP, int HEAD_DIM, int BLOCK>
inline void weigh_rows(Row *const *rows, const T *values, int64_t b) {
  constexpr int NV = HEAD_DIM / 16;
  constexpr int FIT = ACC_REGS / (NV * R);
  constexpr int TILE = FIT < 1 ? 1 : FIT < GROUP ? FIT : GROUP;
  int64_t seen[R], most = 0;
  for (int r = 0; r < R; ++r) {
    seen[r] = std::min<int64_t>(BLOCK, rows[r]->len - b * BLOCK);
    most = std::max(most, seen[r]);
  }
  for (int g0 = 0; g0 < GROUP; g0 += TILE) {
    __m512 acc[R][TILE][NV];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < TILE; ++g)
        if (g0 + g < GROUP)
          for (int c = 0; c < NV; ++c)
            acc[r][g][c] = _mm512_loadu_ps(rows[r]->acc + (g0 + g) * HEAD_DIM + c * 16);
    for (int64_t o = 0; o < most; ++o) {
      __m512 value[NV];
      for (int c = 0; c < NV; ++c) value[c] = load16(values + o * HEAD_DIM + c * 16);
      for (int r = 0; r < R; ++r) {
        if (o >= seen[r]) continue;
        const float *weight = rows[r]->score + b * BLOCK + o;
        for (int g = 0; g < TILE; ++g)
          if (g0 + g < GROUP) {
            const __m512 w = _mm512_set1_ps(weight[(g0 + g) * rows[r]->padded]);
            for (int c = 0; c < NV; ++c) acc[r][g][c] = _mm512_fmadd_ps(w, value[c], acc[r][g][c]);
          }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < TILE; ++g)
        if (g0 + g < GROUP)
          for (int c = 0; c < NV; ++c)
            _mm512_storeu_ps(rows[r]->acc + (g0 + g) * HEAD_DIM + c * 16, acc[r][g][c]);
  }
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

thread_local std::vector<float> scratch;

// One RowGroup against one kv head.
template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
void attend(const Problem &p, const RowGroup &grp, int kv_head) {
  constexpr int64_t BLOCK_ELEMS = static_cast<int64_t>(HEAD_DIM) * BLOCK;
  const T *k = static_cast<const T *>(p.k);
  const T *v = static_cast<const T *>(p.v);
  const int64_t head_offset = kv_head * p.head_stride;
  const int64_t *table = grp.table;

  Row rows[MAX_GROUP_ROWS];
  int64_t need = 0, blocks = 0;
  for (int i = 0; i < grp.count; ++i) {
    Row &r = rows[i];
    r.len = p.kv_lens[grp.first + i];
    r.blocks = (r.len + BLOCK - 1) / BLOCK;
    r.padded = r.blocks * BLOCK;
    blocks = std::max(blocks, r.blocks);
    need += GROUP * (2 * HEAD_DIM + r.padded);
  }
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  float *next = scratch.data();
  for (int i = 0; i < grp.count; ++i) {
    Row &r = rows[i];
    r.query = next;
    r.acc = r.query + GROUP * HEAD_DIM;
    r.score = r.acc + GROUP * HEAD_DIM;
    next = r.score + GROUP * r.padded;
    const T *q = static_cast<const T *>(p.q) + (grp.first + i) * p.q_stride + kv_head * GROUP * HEAD_DIM;
    for (int e = 0; e < GROUP * HEAD_DIM; ++e) r.query[e] = load1(q + e) * p.scale;
    std::memset(r.acc, 0, sizeof(float) * GROUP * HEAD_DIM);
  }
  auto key_block = [&](int64_t b) { return k + table[b] * p.block_stride + head_offset; };
  auto value_block = [&](int64_t b) { return v + table[b] * p.block_stride + head_offset; };
  // The rows that read block b (a shorter row's blocks are a prefix).
  Row *active[MAX_GROUP_ROWS];
  auto rows_of = [&](int64_t b) {
    int count = 0;
    for (int i = 0; i < grp.count; ++i)
      if (b < rows[i].blocks) active[count++] = &rows[i];
    return count;
  };
  for (int64_t b = 0; b < PREFETCH_AHEAD && b < blocks; ++b)
    prefetch_span(key_block(b), BLOCK_ELEMS * sizeof(T));

  // Pass 1: scores.
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t ahead = b + PREFETCH_AHEAD;
    if (ahead < blocks)
      prefetch_span(key_block(ahead), BLOCK_ELEMS * sizeof(T));
    else if (ahead - blocks < blocks)  // pass 2's first blocks
      prefetch_span(value_block(ahead - blocks), BLOCK_ELEMS * sizeof(T));
    const T *keys = key_block(b);
    in_tiles<tile_rows<T>(score_tile_rows<GROUP, BLOCK>())>(active, rows_of(b), [&](Row *const *tile, auto r) {
      score_rows<T, decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(tile, keys, b);
    });
  }

  // Softmax over each row's own keys (the tail of its last block is
  // padding, never read); the 1 / sum is applied to the output.
  for (int i = 0; i < grp.count; ++i)
    for (int g = 0; g < GROUP; ++g)
      rows[i].inv[g] = softmax_numerators(rows[i].score + g * rows[i].padded, rows[i].len);

  // Pass 2: probability-weighted sum of the value rows.
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t ahead = b + PREFETCH_AHEAD;
    if (ahead < blocks) prefetch_span(value_block(ahead), BLOCK_ELEMS * sizeof(T));
    const T *values = value_block(b);
    in_tiles<tile_rows<T>(weigh_tile_rows<GROUP, HEAD_DIM>())>(active, rows_of(b), [&](Row *const *tile, auto r) {
      weigh_rows<T, decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(tile, values, b);
    });
  }

  for (int i = 0; i < grp.count; ++i) {
    const int64_t first_head = static_cast<int64_t>(grp.first + i) * p.num_heads + kv_head * GROUP;
    T *out = static_cast<T *>(p.out) + first_head * HEAD_DIM;
    for (int g = 0; g < GROUP; ++g)
      for (int d = 0; d < HEAD_DIM; ++d)
        store1(out + g * HEAD_DIM + d, rows[i].acc[g * HEAD_DIM + d] * rows[i].inv[g]);
  }
}

template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
void run(const Problem &p) {
  const std::vector<RowGroup> groups = group_rows(p, BLOCK);
  const int items = static_cast<int>(groups.size()) * p.num_kv_heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int item = 0; item < items; ++item)
    attend<T, GROUP, HEAD_DIM, BLOCK>(p, groups[item / p.num_kv_heads], item % p.num_kv_heads);
}

template <typename T, int HEAD_DIM, int BLOCK>
Runner pick_group(int group) {
  switch (group) {
    case 1: return run<T, 1, HEAD_DIM, BLOCK>;
    case 2: return run<T, 2, HEAD_DIM, BLOCK>;
    case 3: return run<T, 3, HEAD_DIM, BLOCK>;
    case 4: return run<T, 4, HEAD_DIM, BLOCK>;
    case 5: return run<T, 5, HEAD_DIM, BLOCK>;
    case 6: return run<T, 6, HEAD_DIM, BLOCK>;
    case 7: return run<T, 7, HEAD_DIM, BLOCK>;
    case 8: return run<T, 8, HEAD_DIM, BLOCK>;
    default: return nullptr;
  }
}

template <typename T, int BLOCK>
Runner pick_head_dim(int head_dim, int group) {
  switch (head_dim) {
    case 64: return pick_group<T, 64, BLOCK>(group);
    case 128: return pick_group<T, 128, BLOCK>(group);
    default: return nullptr;
  }
}

template <typename T>
Runner pick(int head_dim, int group, int block_size) {
  switch (block_size) {
    case 16: return pick_head_dim<T, 16>(head_dim, group);
    case 32: return pick_head_dim<T, 32>(head_dim, group);
    default: return nullptr;
  }
}

}  // namespace

Runner pick_avx512(int is_bf16, int head_dim, int group, int block_size) {
  return is_bf16 ? pick<uint16_t>(head_dim, group, block_size)
                 : pick<float>(head_dim, group, block_size);
}

}  // namespace paged

#else  // no AVX-512: paged_decode.cpp's portable kernel everywhere

namespace paged {
Runner pick_avx512(int, int, int, int) { return nullptr; }
}  // namespace paged

#endif
