// Causal prefill attention for CPUs with AVX512_BF16: one sequence's chunk
// of queries against its keys and values, read from the block pool.
//
// Why hand-written: torch's CPU scaled_dot_product_attention ran the demo
// model's shape (9 query heads over 3 kv heads, head_dim 64, bfloat16) at
// 60-130 GFLOP/s on 2 threads of an AMD EPYC whose vdpbf16ps alone does
// ~450 per core, and a chunk after cached context needed its keys and
// values gathered out of the pool into dense copies first. This kernel:
// 490 GFLOP/s at 414 tokens (6.8x), 620 at 2048 (4.9x) there; on an Intel
// Xeon with AMX, where vdpbf16ps issues only one per ~0.5 ns and the same
// microkernels were 0.4-0.8x SDPA, its AMX path is 1.2-2.5x SDPA and
// 2.0-3.9x the vdpbf16ps one (1 thread; bench/results/prefill_attention.txt).
// Here:
//   - both matmuls (S = Q K^T and O += P V) are tdpbf16ps tiles of 16 rows
//     (prefill_attention_amx.h) where the build has AMX and the OS grants
//     it, else vdpbf16ps microkernels (prefill_attention.h) with their
//     accumulators in registers;
//   - each kv head's keys and values are packed once per call into the
//     instruction's pair layout (the same for both: AMX's B tiles are
//     vdpbf16ps pairs), straight from the pool (no gather), and every
//     query block reads them from there;
//   - a query block holds all GROUP query heads of its kv head (grouped-
//     query attention), so each key and value tile serves all of them;
//   - the softmax is online (flash attention) over key tiles of 64, in
//     float32; the probabilities are rounded to bfloat16 for P V, as flash
//     attention and the decode kernel do;
//   - key tiles past a query block's causal limit are skipped; the tile on
//     the diagonal is masked.
//
// Layouts (strides in elements):
//   q            [q_len, num_heads, HEAD_DIM], rows q_stride apart
//   out          [q_len, num_heads, HEAD_DIM], contiguous
//   k, v         the paged pool as in paged_decode.cpp (keys [HEAD_DIM][BLOCK]
//                and values [BLOCK][HEAD_DIM] per block and kv head)
//   block_table  [ceil(kv_len / block_size)] int64, the sequence's blocks
// Query i sees keys [0, kv_len - q_len + i]: the chunk's own causal past
// and everything cached before it.
//
// A row's result (one query position and head) depends only on its query,
// its keys and its limit: key tiles start at multiples of 64 whatever the
// query blocks, every row runs the same instructions on them (on AMX each
// C tile element is its own dot product, accumulated in a fixed order),
// and a tile past a row's limit (processed because other rows of its tile
// need it) adds exact zeros and rescales by exactly 1. So a chunk's rows
// are bit-identical computed alone or inside a longer chunk, in any
// blocking. The two paths round differently, so one machine must keep to
// one: the path is fixed per build and process.
//
// Without AVX512_BF16 at build time the kernel reports itself unsupported
// and the torch backend keeps scaled_dot_product_attention.

#include <cstdint>

#ifdef __AVX512BF16__

#include <algorithm>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define PREFILL_AMX
#include "prefill_attention_amx.h"
#else
#include "prefill_attention.h"
#endif

namespace {

using namespace prefill;

struct Problem {
  const uint16_t *q;
  int64_t q_stride;
  const uint16_t *k, *v;
  const int64_t *table;
  int64_t q_len, kv_len;
  uint16_t *out;
  int num_heads, num_kv_heads, block_size;
  int64_t block_stride, head_stride;
  float scale;
};

// Query positions per work item: GROUP * QUERY_BLOCK rows share each key
// and value tile while it is in L1.
constexpr int QUERY_BLOCK = 32;

// Key tile kt of kv head h into the pair layouts: keys as [HEAD_DIM / 2]
// [TILE][2] (dims d, d + 1 of one key), values as [TILE / 2][HEAD_DIM][2]
// (keys t, t + 1 of one dim). Keys past kv_len are zeros: the pool's slots
// past a sequence's end hold anything, and 0 * NaN would be NaN.
template <int HEAD_DIM>
void pack_tile(const Problem &p, int h, int64_t kt, uint16_t *keys, uint16_t *values) {
  for (int c = 0; c < TILE / 16; ++c) {
    const int64_t t0 = kt * TILE + c * 16;
    const int64_t count = std::min<int64_t>(16, std::max<int64_t>(0, p.kv_len - t0));
    const uint16_t *src = count ? p.k + p.table[t0 / p.block_size] * p.block_stride +
                                      h * p.head_stride + t0 % p.block_size
                                : nullptr;
    for (int dp = 0; dp < HEAD_DIM / 2; ++dp)
      _mm512_storeu_si512(keys + (dp * TILE + c * 16) * 2,
                          count ? key_pairs(src + 2 * dp * p.block_size, p.block_size, count)
                                : _mm512_setzero_si512());
  }
  for (int j = 0; j < TILE / 2; ++j) {
    const int64_t t = kt * TILE + 2 * j;
    const uint16_t *row = t < p.kv_len ? p.v + p.table[t / p.block_size] * p.block_stride +
                                             h * p.head_stride + t % p.block_size * HEAD_DIM
                                       : nullptr;
    for (int d = 0; d < HEAD_DIM; d += 32)
      value_pairs(row ? row + d : nullptr, t + 1 < p.kv_len ? row + HEAD_DIM + d : nullptr,
                  values + (j * HEAD_DIM + d) * 2);
  }
}

// A 64-byte aligned row of a key tile's scores or probabilities (the
// softmax loads them aligned).
template <typename T>
struct alignas(64) TileRow {
  T at[TILE];
};

// Per-thread state of one work item: its rows' queries (bfloat16, as
// given), output accumulators, running max and sum; for AMX also every
// row's scores, probabilities and rescale factor of the current key tile.
struct Scratch {
  std::vector<uint16_t> query;
  std::vector<float> acc, max, sum, factor;
  std::vector<TileRow<float>> scores;
  std::vector<TileRow<uint16_t>> probs;
};
thread_local Scratch scratch;

// One work item: kv head h, query positions [first, first + rows / group).
// Row r is position first + r / group, query head h * group + r % group:
// rows are in position order, so a run of rows' last sees the most keys.
struct Item {
  int h, group, rows;
  int64_t first, offset;  // offset: keys before the chunk

  // Keys of key tile kt that row r sees (0..TILE).
  int visible(int r, int64_t kt) const {
    return static_cast<int>(
        std::clamp<int64_t>(offset + first + r / group + 1 - kt * TILE, 0, TILE));
  }
};

// Resets the thread's scratch for an item: queries copied (padded to
// whole tiles of ROWS), accumulators zero, no max yet.
template <int ROWS, int HEAD_DIM>
Item begin_item(const Problem &p, int h, int64_t first, int64_t last, Scratch &s) {
  const int group = p.num_heads / p.num_kv_heads;
  const Item item{h, group, static_cast<int>(last - first) * group, first, p.kv_len - p.q_len};
  s.query.resize(static_cast<size_t>((item.rows + ROWS - 1) / ROWS * ROWS) * HEAD_DIM);
  s.acc.assign(static_cast<size_t>(item.rows) * HEAD_DIM, 0.f);
  s.max.assign(item.rows, NO_MAX);
  s.sum.assign(item.rows, 0.f);
  for (int r = 0; r < item.rows; ++r)
    std::copy_n(p.q + (first + r / group) * p.q_stride + (h * group + r % group) * HEAD_DIM,
                HEAD_DIM, s.query.data() + r * HEAD_DIM);
  return item;
}

template <int HEAD_DIM>
void finish_item(const Problem &p, const Item &item, const Scratch &s) {
  for (int r = 0; r < item.rows; ++r)
    store_row<HEAD_DIM>(s.acc.data() + r * HEAD_DIM, 1.f / s.sum[r],
                        p.out + ((item.first + r / item.group) * p.num_heads +
                                 item.h * item.group + r % item.group) *
                                    HEAD_DIM);
}

// The last key tile any row of the item sees.
inline int64_t last_tile(const Item &item) {
  return (item.offset + item.first + (item.rows - 1) / item.group) / TILE;
}

// vdpbf16ps: per key tile, 6 rows at a time through scores, softmax and
// P V, the microkernels' accumulators in registers.
struct VdpPath {
  static void enter() {}
  static void leave() {}

  template <int HEAD_DIM>
  static void attend(const Problem &p, const uint16_t *packed_k, const uint16_t *packed_v, int h,
                     int64_t first, int64_t last) {
    Scratch &s = scratch;
    const Item item = begin_item<ROW_TILE, HEAD_DIM>(p, h, first, last, s);
    const int64_t tile_elems = static_cast<int64_t>(TILE) * HEAD_DIM;
    alignas(64) float scores[ROW_TILE][TILE] = {};
    alignas(64) uint16_t probs[ROW_TILE][TILE];
    float scale_by[ROW_TILE];
    for (int64_t kt = 0; kt <= last_tile(item); ++kt) {
      const uint16_t *keys = packed_k + kt * tile_elems;
      const uint16_t *values = packed_v + kt * tile_elems;
      for (int r0 = 0; r0 < item.rows; r0 += ROW_TILE) {
        const int n = std::min(ROW_TILE, item.rows - r0);
        int visible[ROW_TILE];
        for (int i = 0; i < n; ++i) visible[i] = item.visible(r0 + i, kt);
        if (visible[n - 1] == 0) continue;  // the whole row tile is before this tile
        // On the diagonal, only the 16-key vectors some row sees (the rest
        // of `scores` keeps older, finite values that the softmax masks).
        const uint16_t *q = s.query.data() + r0 * HEAD_DIM;
        with_count(n, [&](auto r) {
          constexpr int R = decltype(r)::value;
          with_count((visible[n - 1] + 15) / 16, [&](auto c) {
            constexpr int NC = decltype(c)::value;
            if constexpr (NC <= TILE / 16) score_tile<R, NC, HEAD_DIM>(q, keys, scores);
          });
        });
        for (int i = 0; i < n; ++i)
          scale_by[i] = softmax_tile(scores[i], visible[i], p.scale, s.max[r0 + i],
                                     s.sum[r0 + i], probs[i]);
        const int pairs = (visible[n - 1] + 1) / 2;
        float *acc = s.acc.data() + r0 * HEAD_DIM;
        with_count(n, [&](auto r) {
          weigh_tile<decltype(r)::value, HEAD_DIM>(probs, values, pairs, scale_by, acc);
        });
      }
    }
    finish_item<HEAD_DIM>(p, item, s);
  }
};

#ifdef PREFILL_AMX
// AMX: per key tile, the scores of all rows (16 at a time), then every
// row's softmax, then P V of all rows. In phases because a tile result is
// slow to reach vector loads and vector stores slow to reach tile loads:
// alternating per 16 rows, the tile instructions waited on each other
// (the kernel took ~1.4x as long). Rows past `rows` in a tile of 16
// (the query copy is padded) compute what nobody reads.
struct AmxPath {
  static void enter() {
    static const amx::TileConfig config = amx_config();
    _tile_loadconfig(&config);
  }
  static void leave() { _tile_release(); }

  template <int HEAD_DIM>
  static void attend(const Problem &p, const uint16_t *packed_k, const uint16_t *packed_v, int h,
                     int64_t first, int64_t last) {
    Scratch &s = scratch;
    const Item item = begin_item<AMX_ROWS, HEAD_DIM>(p, h, first, last, s);
    const int row_tiles = (item.rows + AMX_ROWS - 1) / AMX_ROWS;
    s.scores.resize(static_cast<size_t>(row_tiles) * AMX_ROWS);
    s.probs.resize(static_cast<size_t>(row_tiles) * AMX_ROWS);
    s.factor.resize(item.rows);
    const int64_t tile_elems = static_cast<int64_t>(TILE) * HEAD_DIM;
    for (int64_t kt = 0; kt <= last_tile(item); ++kt) {
      // Keys of this tile that row tile i's last row sees: the most.
      const auto seen = [&](int i) {
        return item.visible(std::min((i + 1) * AMX_ROWS, item.rows) - 1, kt);
      };
      for (int i = 0; i < row_tiles; ++i)
        if (seen(i))
          amx_score_tile<HEAD_DIM>(s.query.data() + i * AMX_ROWS * HEAD_DIM,
                                   packed_k + kt * tile_elems, (seen(i) + 15) / 16,
                                   s.scores[i * AMX_ROWS].at);
      for (int r = 0; r < item.rows; ++r)
        s.factor[r] = softmax_tile(s.scores[r].at, item.visible(r, kt), p.scale, s.max[r],
                                   s.sum[r], s.probs[r].at);
      for (int i = 0; i < row_tiles; ++i)
        if (seen(i))
          amx_weigh_tile<HEAD_DIM>(s.probs[i * AMX_ROWS].at, packed_v + kt * tile_elems,
                                   (seen(i) + AMX_DEPTH - 1) / AMX_DEPTH,
                                   std::min(AMX_ROWS, item.rows - i * AMX_ROWS),
                                   s.factor.data() + i * AMX_ROWS,
                                   s.acc.data() + i * AMX_ROWS * HEAD_DIM);
    }
    finish_item<HEAD_DIM>(p, item, s);
  }
};
#endif

template <typename Path, int HEAD_DIM>
void run(const Problem &p) {
  const int64_t tiles = (p.kv_len + TILE - 1) / TILE;
  const int64_t tile_elems = static_cast<int64_t>(TILE) * HEAD_DIM;
  // Packed keys and values of every kv head, shared by the threads; kept
  // by the calling thread between calls (a layer's worth, reused by the next).
  thread_local std::vector<uint16_t> packed;
  packed.resize(static_cast<size_t>(2 * p.num_kv_heads * tiles * tile_elems));
  uint16_t *packed_k = packed.data();
  uint16_t *packed_v = packed_k + p.num_kv_heads * tiles * tile_elems;
  const int64_t blocks = (p.q_len + QUERY_BLOCK - 1) / QUERY_BLOCK;
  // Items with the most key tiles (the last query blocks) first: threads
  // take items as they finish, so the short ones fill in at the end.
  const int64_t items = blocks * p.num_kv_heads;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < p.num_kv_heads * tiles; ++i)
      pack_tile<HEAD_DIM>(p, static_cast<int>(i / tiles), i % tiles,
                          packed_k + i * tile_elems, packed_v + i * tile_elems);
    Path::enter();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; ++i) {
      const int h = static_cast<int>(i % p.num_kv_heads);
      const int64_t first = (blocks - 1 - i / p.num_kv_heads) * QUERY_BLOCK;
      Path::template attend<HEAD_DIM>(p, packed_k + h * tiles * tile_elems,
                                      packed_v + h * tiles * tile_elems, h, first,
                                      std::min(first + QUERY_BLOCK, p.q_len));
    }
    Path::leave();
  }
}

using Runner = void (*)(const Problem &);

template <typename Path>
Runner pick_for(int head_dim) {
  switch (head_dim) {
    case 64: return run<Path, 64>;
    case 128: return run<Path, 128>;
    default: return nullptr;
  }
}

// AMX where the build has it and the OS grants it, vdpbf16ps elsewhere.
Runner pick(int head_dim, int group, int block_size) {
  if (group < 1 || block_size < 16 || block_size % 16) return nullptr;
#ifdef PREFILL_AMX
  if (amx::amx_permitted()) return pick_for<AmxPath>(head_dim);
#endif
  return pick_for<VdpPath>(head_dim);
}

}  // namespace

extern "C" {

// 1 when the kernel exists for this shape (bfloat16 only).
int prefill_attention_supported(int head_dim, int group, int block_size) {
  return pick(head_dim, group, block_size) != nullptr;
}

// Returns 0, or -1 for an unsupported shape or q_len > kv_len (nothing
// written). q rows may be strided (a view into the fused qkv output).
int prefill_attention(const void *q, int64_t q_stride, const void *k, const void *v,
                      const int64_t *block_table, int64_t q_len, int64_t kv_len, void *out,
                      int num_heads, int num_kv_heads, int head_dim, int block_size,
                      int64_t block_stride, int64_t head_stride, float scale) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads || q_len > kv_len || q_len < 0) return -1;
  Runner runner = pick(head_dim, num_heads / num_kv_heads, block_size);
  if (runner == nullptr) return -1;
  if (q_len == 0) return 0;
  runner({static_cast<const uint16_t *>(q), q_stride, static_cast<const uint16_t *>(k),
          static_cast<const uint16_t *>(v), block_table, q_len, kv_len,
          static_cast<uint16_t *>(out), num_heads, num_kv_heads, block_size, block_stride,
          head_stride, scale});
  return 0;
}

}  // extern "C"

#else  // no AVX512_BF16: callers keep torch's attention

extern "C" {
int prefill_attention_supported(int, int, int) { return 0; }
int prefill_attention(const void *, int64_t, const void *, const void *, const int64_t *, int64_t,
                      int64_t, void *, int, int, int, int, int64_t, int64_t, float) {
  return -1;
}
}  // extern "C"

#endif
