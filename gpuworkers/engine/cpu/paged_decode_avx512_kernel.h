// The AVX-512 decode kernel's templates, included by paged_decode_avx512.cpp
// (bfloat16 and float32 pools) and paged_decode_avx512_int8.cpp (int8
// pools), so that the two sets of instances compile in parallel. See
// paged_decode_avx512.cpp for the design. Included only where __AVX512F__
// is defined.

#pragma once

#include "paged_decode_avx512.h"
#include "paged_decode_bf16.h"

#include <omp.h>

namespace paged {
namespace avx512 {


// int8 widened to float32 (an int8 pool's values before their scale).
inline __m512 load16(const int8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
}

// Scores of block b's keys ([HEAD_DIM][BLOCK]) for R rows' GROUP heads,
// into row.score[g * padded + b * BLOCK + j]. Each key vector is loaded
// once for the R rows; each (row, head) keeps its own chains, so its bits
// do not depend on R or on the other rows. An int8 block's sums are
// multiplied by its keys' scales (stored after the keys).
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
        if constexpr (std::is_same_v<T, int8_t>)
          sum = _mm512_mul_ps(sum, _mm512_loadu_ps(block_scales<HEAD_DIM, BLOCK>(keys) + c * 16));
        _mm512_storeu_ps(rows[r]->score + g * rows[r]->padded + b * BLOCK + c * 16, sum);
      }
}

template <int GROUP, int HEAD_DIM>
constexpr int weigh_tile_rows() {
  constexpr int rows = ACC_REGS / (HEAD_DIM / 16);
  return rows < 1 ? 1 : rows > VALUE_TILE_ROWS ? VALUE_TILE_ROWS : rows;
}

// row.acc[g][:] += sum over block b's value rows ([BLOCK][HEAD_DIM]) that
// the row sees, weighted by its softmax numerators (times the row's scale
// in an int8 block), for R rows. Heads are
// tiled so the accumulators stay in registers (acc lives in memory
// between blocks and tiles, exactly); each (row, head) adds its values in
// token order whatever the tiling.
template <typename T, int R, int GROUP, int HEAD_DIM, int BLOCK>
inline void weigh_rows(Row *const *rows, const T *values, int64_t b) {
  constexpr int NV = HEAD_DIM / 16;
  constexpr int FIT = ACC_REGS / (NV * R);
  constexpr int TILE = FIT < 1 ? 1 : FIT < GROUP ? FIT : GROUP;
  int64_t seen[R];
  const int64_t most = block_extents<R, BLOCK>(rows, b, seen);
  for (int g0 = 0; g0 < GROUP; g0 += TILE) {
    __m512 acc[R][TILE][NV];
    load_accumulators<R, TILE, NV, GROUP, HEAD_DIM>(acc, rows, g0);
    for (int64_t o = 0; o < most; ++o) {
      __m512 value[NV];
      for (int c = 0; c < NV; ++c) value[c] = load16(values + o * HEAD_DIM + c * 16);
      float value_scale = 1.f;
      if constexpr (std::is_same_v<T, int8_t>) value_scale = block_scales<HEAD_DIM, BLOCK>(values)[o];
      for (int r = 0; r < R; ++r) {
        if (o >= seen[r]) continue;
        const float *weight = rows[r]->score + b * BLOCK + o;
        for (int g = 0; g < TILE; ++g)
          if (g0 + g < GROUP) {
            const __m512 w = _mm512_set1_ps(weight[(g0 + g) * rows[r]->padded] * value_scale);
            for (int c = 0; c < NV; ++c) acc[r][g][c] = _mm512_fmadd_ps(w, value[c], acc[r][g][c]);
          }
      }
    }
    store_accumulators<R, TILE, NV, GROUP, HEAD_DIM>(acc, rows, g0);
  }
}

inline thread_local std::vector<float> scratch;
inline thread_local std::vector<Row> row_state;

// A work item: one RowGroup against kv heads [head_begin, head_end).
struct Item {
  const RowGroup *grp;
  int head_begin, head_end;
};

// One item. Block by block, each kv head's rows run exactly as they would
// in an item of that head alone: the heads only share the loop (and the
// contiguous memory they read), never arithmetic.
template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
void attend(const Problem &p, const Item &item) {
  using Q = typename Types<T>::query;
  using KV = typename Types<T>::cache;
  constexpr int64_t HEAD_BYTES = head_bytes<T, HEAD_DIM, BLOCK>();
  const RowGroup &grp = *item.grp;
  const KV *k = static_cast<const KV *>(p.k);
  const KV *v = static_cast<const KV *>(p.v);
  const int64_t *table = grp.table;
  const int heads = item.head_end - item.head_begin;
  constexpr bool paired = PAIRED_BF16 && std::is_same_v<T, uint16_t>;

  // row(h, i): row i's state for kv head item.head_begin + h.
  if (static_cast<int>(row_state.size()) < heads * MAX_GROUP_ROWS)
    row_state.resize(heads * MAX_GROUP_ROWS);
  auto row = [&](int h, int i) -> Row & { return row_state[h * MAX_GROUP_ROWS + i]; };
  int64_t need = 0, blocks = 0;
  for (int i = 0; i < grp.count; ++i) {
    const int64_t row_blocks = (p.kv_lens[grp.first + i] + BLOCK - 1) / BLOCK;
    blocks = std::max(blocks, row_blocks);
    need += heads * GROUP * (2 * HEAD_DIM + row_blocks * BLOCK);
  }
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  float *next = scratch.data();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < grp.count; ++i) {
      Row &r = row(h, i);
      r.len = p.kv_lens[grp.first + i];
      r.blocks = (r.len + BLOCK - 1) / BLOCK;
      r.padded = r.blocks * BLOCK;
      r.query = next;
      r.acc = r.query + GROUP * HEAD_DIM;
      r.score = r.acc + GROUP * HEAD_DIM;
      next = r.score + GROUP * r.padded;
      const Q *q = static_cast<const Q *>(p.q) + (grp.first + i) * p.q_stride +
                   (item.head_begin + h) * GROUP * HEAD_DIM;
      if constexpr (paired)
        std::memcpy(r.query, q, sizeof(Q) * GROUP * HEAD_DIM);
      else
        for (int e = 0; e < GROUP * HEAD_DIM; ++e) r.query[e] = load1(q + e) * p.scale;
      std::memset(r.acc, 0, sizeof(float) * GROUP * HEAD_DIM);
    }
  // The item's heads of a block (one contiguous run in the backend's pool).
  auto key_block = [&](int64_t b) { return k + table[b] * p.block_stride + item.head_begin * p.head_stride; };
  auto value_block = [&](int64_t b) { return v + table[b] * p.block_stride + item.head_begin * p.head_stride; };
  // Head h's part of the block PREFETCH_AHEAD ahead (far, or nullptr):
  // bfloat16's kernels prefetch it a line or a few at a time between their
  // loads (prefetch_step); float32 (tests) here, at once.
  auto part = [&](const KV *far, int h) -> const char * {
    if (far == nullptr) return nullptr;
    const char *start = reinterpret_cast<const char *>(far + h * p.head_stride);
    if constexpr (paired) return start;
    prefetch_span(start, HEAD_BYTES);
    return nullptr;
  };
  // The rows that read block b for head h (a shorter row's blocks are a prefix).
  Row *active[MAX_GROUP_ROWS];
  auto rows_of = [&](int h, int64_t b) {
    int count = 0;
    for (int i = 0; i < grp.count; ++i)
      if (b < row(h, i).blocks) active[count++] = &row(h, i);
    return count;
  };
  for (int64_t b = 0; b < PREFETCH_AHEAD && b < blocks; ++b)
    for (int h = 0; h < heads; ++h)
      prefetch_span(key_block(b) + h * p.head_stride, HEAD_BYTES);

  // Pass 1: scores.
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t ahead = b + PREFETCH_AHEAD;
    const KV *far = ahead < blocks           ? key_block(ahead)
                   : ahead - blocks < blocks ? value_block(ahead - blocks)  // pass 2's first
                                             : nullptr;
    for (int h = 0; h < heads; ++h) {
      const char *prefetch = part(far, h);
      const KV *keys = key_block(b) + h * p.head_stride;
      in_tiles<tile_rows<Q>(score_tile_rows<GROUP, BLOCK>())>(active, rows_of(h, b), [&](Row *const *tile, auto r) {
        if constexpr (paired)
          score_rows_bf16<decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(
              tile, keys, b, p.scale, tile == active ? prefetch : nullptr);
        else
          score_rows<KV, decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(tile, keys, b);
      });
    }
  }

  // Softmax over each row's own keys (the tail of its last block is
  // padding, never read); the 1 / sum is applied to the output.
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < grp.count; ++i) {
      Row &r = row(h, i);
      for (int g = 0; g < GROUP; ++g) r.inv[g] = softmax_numerators(r.score + g * r.padded, r.len);
      if constexpr (paired) weights_to_bf16(r, GROUP);
    }

  // Pass 2: probability-weighted sum of the value rows.
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t ahead = b + PREFETCH_AHEAD;
    const KV *far = ahead < blocks ? value_block(ahead) : nullptr;
    for (int h = 0; h < heads; ++h) {
      const char *prefetch = part(far, h);
      const KV *values = value_block(b) + h * p.head_stride;
      in_tiles<tile_rows<Q>(weigh_tile_rows<GROUP, HEAD_DIM>())>(active, rows_of(h, b), [&](Row *const *tile, auto r) {
        if constexpr (paired)
          weigh_rows_bf16<decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(
              tile, values, b, tile == active ? prefetch : nullptr);
        else
          weigh_rows<KV, decltype(r)::value, GROUP, HEAD_DIM, BLOCK>(tile, values, b);
      });
    }
  }

  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < grp.count; ++i) {
      Row &r = row(h, i);
      const int64_t first_head =
          static_cast<int64_t>(grp.first + i) * p.num_heads + (item.head_begin + h) * GROUP;
      Q *out = static_cast<Q *>(p.out) + first_head * HEAD_DIM;
      for (int g = 0; g < GROUP; ++g)
        for (int d = 0; d < HEAD_DIM; ++d)
          store1(out + g * HEAD_DIM + d, r.acc[g * HEAD_DIM + (paired ? value_lane(d) : d)] * r.inv[g]);
    }
}

// Items cover all kv heads of a group where there are at least this many
// groups per thread; fewer groups (a batch of one long sequence) are split
// by kv head, so that every thread has work. Either way each (row, head)
// runs the same arithmetic: the choice, which follows the batch and the
// thread count, changes no bits.
constexpr int WHOLE_GROUPS_PER_THREAD = 4;

struct Kernel {
  template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
  static void run(const Problem &p) {
    std::vector<RowGroup> groups = group_rows(p, BLOCK);
    // Longest first: threads take items as they finish, and a long item
    // taken last would leave the other thread idle (batches come sorted by
    // length). The order of items does not change any row's arithmetic.
    std::vector<int64_t> keys(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      int64_t most = 0;
      for (int r = 0; r < groups[i].count; ++r) most = std::max(most, p.kv_lens[groups[i].first + r]);
      keys[i] = most * groups[i].count;
    }
    std::vector<int> order(groups.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] > keys[b]; });
    const bool whole =
        static_cast<int64_t>(groups.size()) >= WHOLE_GROUPS_PER_THREAD * omp_get_max_threads();
    const int per_item = whole ? p.num_kv_heads : 1;
    const int parts = p.num_kv_heads / per_item;
    std::vector<Item> items(groups.size() * parts);
    for (size_t i = 0; i < items.size(); ++i) {
      const int first = static_cast<int>(i % parts) * per_item;
      items[i] = {&groups[order[i / parts]], first, first + per_item};
    }
    const int count = static_cast<int>(items.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < count; ++i) attend<T, GROUP, HEAD_DIM, BLOCK>(p, items[i]);
  }
};

}  // namespace avx512
}  // namespace paged
