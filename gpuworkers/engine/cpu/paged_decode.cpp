// Paged decode attention for CPUs: one query token per sequence, keys and
// values read in place from the block pool.
//
// Why hand-written: torch has no paged attention for CPU, and the gather +
// matmul path copies every sequence's whole K/V twice per layer (index_select,
// then a transposing copy) before reading it again. Decode attention is
// memory-bound: this kernel reads each key and value once, in float32
// registers, with no horizontal sums.
//
// Built by build.py with -O3 -march=native -ffast-math -fopenmp and loaded
// with ctypes: no torch headers, so it compiles in seconds. OpenMP resolves
// to the libgomp torch has already loaded (same soname): one thread pool.
//
// Layouts (the torch backend's pool; strides in elements):
//   q, out       [num_seqs, num_heads, HEAD_DIM], contiguous
//   k block      [num_kv_heads, HEAD_DIM, BLOCK]: keys transposed, so the
//                scores of a block's BLOCK tokens are one vector per head
//   v block      [num_kv_heads, BLOCK, HEAD_DIM]
//   block b of the pool starts at b * block_stride; kv head h of a block at
//   h * head_stride (both shared by K and V)
//   block_tables [num_tables, table_stride] int64, kv_lens [num_seqs] int64
//   int8 pools   (kv_cache_dtype "int8") the same, int8, each (block, kv
//                head) followed by block_size float32 scales, one per token
//                (paged_decode.h, Int8KV); head_stride then counts bytes
//   table_rows   [num_seqs] int64 or null: query row i reads block_tables
//                row table_rows[i] (null: row i). Lets every token of a
//                prefill chunk be its own query row over one shared table
//                (the engine's deterministic mode) without copying tables.
//
// Query heads q*GROUP .. q*GROUP+GROUP-1 share kv head q (grouped-query
// attention); GROUP, HEAD_DIM and BLOCK are template parameters so that the
// accumulators stay in registers.
//
// Where the compiler targets AVX-512, paged_decode_avx512.cpp's kernel is
// used instead of the portable one below; it also reads each block once
// for consecutive rows over the same blocks (group_rows). Either way a
// row's result depends only on its own query, keys and length.

#include <math.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "paged_decode.h"

namespace paged {

// Rows i and i + 1 share blocks when they read the same table row, or
// tables equal over the blocks both read (the torch metadata copies a
// verification's table into each of its rows). The group's table is its
// longest row's: every other member matches it on its own blocks.
std::vector<RowGroup> group_rows(const Problem &p, int block_size) {
  std::vector<RowGroup> groups;
  groups.reserve(p.num_seqs);
  int64_t leader_blocks = 0;
  for (int i = 0; i < p.num_seqs; ++i) {
    const int64_t *table = p.block_tables + (p.table_rows ? p.table_rows[i] : i) * p.table_stride;
    const int64_t blocks = (p.kv_lens[i] + block_size - 1) / block_size;
    if (!groups.empty()) {
      RowGroup &last = groups.back();
      const int64_t common = blocks < leader_blocks ? blocks : leader_blocks;
      if (last.count < MAX_GROUP_ROWS &&
          (table == last.table ||
           std::memcmp(table, last.table, common * sizeof(int64_t)) == 0)) {
        ++last.count;
        if (blocks > leader_blocks) {
          last.table = table;
          leader_blocks = blocks;
        }
        continue;
      }
    }
    groups.push_back({i, 1, table});
    leader_blocks = blocks;
  }
  return groups;
}

}  // namespace paged

namespace {

using paged::Problem;
using paged::Runner;
using paged::load1;
using paged::store1;

// One (sequence, kv head): GROUP query heads against that head's keys.
// T: the query and pool types (paged_decode.h's Types): an int8 pool's
// scores are scaled per key after the dot product, and its value rows
// weighted by probability x scale.
template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
void attend(const Problem &p, int seq, int kv_head, std::vector<float> &scores) {
  using Q = typename paged::Types<T>::query;
  using KV = typename paged::Types<T>::cache;
  constexpr bool int8 = paged::Types<T>::int8;
  const KV *k = static_cast<const KV *>(p.k);
  const KV *v = static_cast<const KV *>(p.v);
  const int64_t len = p.kv_lens[seq];
  const int64_t table_row = p.table_rows ? p.table_rows[seq] : seq;
  const int64_t *table = p.block_tables + table_row * p.table_stride;
  const int64_t num_blocks = (len + BLOCK - 1) / BLOCK;
  const int64_t first_head = static_cast<int64_t>(seq) * p.num_heads + kv_head * GROUP;
  const Q *q = static_cast<const Q *>(p.q) + seq * p.q_stride + kv_head * GROUP * HEAD_DIM;
  const int64_t head_offset = kv_head * p.head_stride;

  float query[GROUP][HEAD_DIM];
  for (int g = 0; g < GROUP; ++g)
    for (int d = 0; d < HEAD_DIM; ++d) query[g][d] = load1(q + g * HEAD_DIM + d) * p.scale;

  // Pass 1: scores, BLOCK tokens at a time; each key element is loaded once
  // and feeds GROUP fused multiply-adds. Blocks sit anywhere in the pool,
  // where the hardware prefetcher cannot follow: the next block is fetched
  // by hand while this one is computed.
  scores.resize(static_cast<size_t>(GROUP) * num_blocks * BLOCK);
  float *score = scores.data();
  const int64_t padded = num_blocks * BLOCK;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const KV *keys = k + table[b] * p.block_stride + head_offset;  // [HEAD_DIM][BLOCK]
    const KV *next = b + 1 < num_blocks ? k + table[b + 1] * p.block_stride + head_offset : keys;
    float acc[GROUP][BLOCK] = {};
    for (int d = 0; d < HEAD_DIM; ++d) {
      // The next block, a line at a time, while this one is computed.
      if (d * BLOCK * sizeof(KV) % 64 == 0) __builtin_prefetch(next + d * BLOCK);
      float key[BLOCK];
      for (int j = 0; j < BLOCK; ++j) key[j] = load1(keys + d * BLOCK + j);
      for (int g = 0; g < GROUP; ++g)
        for (int j = 0; j < BLOCK; ++j) acc[g][j] += query[g][d] * key[j];
    }
    float key_scale[BLOCK];
    for (int j = 0; j < BLOCK; ++j) {
      if constexpr (int8)
        key_scale[j] = paged::block_scales<HEAD_DIM, BLOCK>(keys)[j];
      else
        key_scale[j] = 1.f;
    }
    for (int g = 0; g < GROUP; ++g)
      for (int j = 0; j < BLOCK; ++j) score[g * padded + b * BLOCK + j] = acc[g][j] * key_scale[j];
  }

  // Softmax in float32 over the valid keys (the tail of the last block is
  // padding and is never read).
  for (int g = 0; g < GROUP; ++g) {
    float *s = score + g * padded;
    float peak = s[0];
    for (int64_t t = 1; t < len; ++t) peak = s[t] > peak ? s[t] : peak;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      s[t] = expf(s[t] - peak);
      sum += s[t];
    }
    const float inv = 1.f / sum;
    for (int64_t t = 0; t < len; ++t) s[t] *= inv;
  }

  // Pass 2: probability-weighted sum of the value rows, each read once.
  float acc[GROUP][HEAD_DIM] = {};
  for (int64_t b = 0, t = 0; b < num_blocks; ++b) {
    const KV *values = v + table[b] * p.block_stride + head_offset;  // [BLOCK][HEAD_DIM]
    const KV *next = b + 1 < num_blocks ? v + table[b + 1] * p.block_stride + head_offset : values;
    const int64_t rows = len - t < BLOCK ? len - t : BLOCK;
    for (int64_t o = 0; o < rows; ++o, ++t) {
      for (int64_t line = 0; line < HEAD_DIM * sizeof(KV); line += 64)
        __builtin_prefetch(reinterpret_cast<const char *>(next + o * HEAD_DIM) + line);
      float value[HEAD_DIM];
      for (int d = 0; d < HEAD_DIM; ++d) value[d] = load1(values + o * HEAD_DIM + d);
      float value_scale = 1.f;
      if constexpr (int8) value_scale = paged::block_scales<HEAD_DIM, BLOCK>(values)[o];
      for (int g = 0; g < GROUP; ++g) {
        const float w = score[g * padded + t] * value_scale;
        for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] += w * value[d];
      }
    }
  }
  Q *out = static_cast<Q *>(p.out) + first_head * HEAD_DIM;
  for (int g = 0; g < GROUP; ++g)
    for (int d = 0; d < HEAD_DIM; ++d) store1(out + g * HEAD_DIM + d, acc[g][d]);
}

struct Portable {
  template <typename T, int GROUP, int HEAD_DIM, int BLOCK>
  static void run(const Problem &p) {
    const int items = p.num_seqs * p.num_kv_heads;
#pragma omp parallel
    {
      std::vector<float> scores;  // per thread, reused across items
#pragma omp for schedule(dynamic, 1)
      for (int item = 0; item < items; ++item)
        attend<T, GROUP, HEAD_DIM, BLOCK>(p, item / p.num_kv_heads, item % p.num_kv_heads, scores);
    }
  }
};

Runner pick_for(int kind, int head_dim, int group, int block_size) {
  Runner fast = kind & paged::KIND_INT8 ? paged::pick_avx512_int8(kind, head_dim, group, block_size)
                                        : paged::pick_avx512(kind, head_dim, group, block_size);
  if (fast) return fast;
  return paged::pick_shape<Portable>(kind, head_dim, group, block_size);
}

// Store new tokens' keys and values at their slots (block * block_size +
// offset) in the torch backend's layout: keys transposed per block and kv
// head ([head_dim][block_size]), values as rows. k and v rows may be
// strided (views into the fused qkv output), each with its own stride.
template <typename T>
void write_kv(const T *k, int64_t k_stride, const T *v, int64_t v_stride, const int64_t *slots,
              int64_t tokens,
              T *keys, T *values, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
              int64_t block_stride, int64_t head_stride) {
#pragma omp parallel for schedule(static) if (tokens > 64)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      const T *key = k + t * k_stride + h * head_dim;
      const T *value = v + t * v_stride + h * head_dim;
      T *key_dst = keys + block * block_stride + h * head_stride + offset;
      T *value_dst = values + block * block_stride + h * head_stride + offset * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) key_dst[d * block_size] = key[d];
      std::memcpy(value_dst, value, head_dim * sizeof(T));
    }
  }
}

// Quantize n elements of x (symmetric, scale = absmax / 127) into dst,
// dst_step apart; returns the scale. Rounds half to even, as torch.round
// in the torch backend's write (torch_backend.quantize_rows).
template <typename T>
inline float quantize_row(const T *x, int64_t n, int8_t *dst, int64_t dst_step) {
  float peak = 0.f;
  for (int64_t d = 0; d < n; ++d) peak = fmaxf(peak, fabsf(load1(x + d)));
  const float inv = peak > 0.f ? 127.f / peak : 0.f;
  for (int64_t d = 0; d < n; ++d) {
    const float r = nearbyintf(load1(x + d) * inv);
    dst[d * dst_step] = static_cast<int8_t>(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
  }
  return peak / 127.f;
}

// write_kv for an int8 pool: each (token, kv head) quantized on its own,
// the scale stored after its block's data (paged_decode.h, Int8KV).
template <typename T>
void write_kv_int8(const T *k, int64_t k_stride, const T *v, int64_t v_stride,
                   const int64_t *slots, int64_t tokens, int8_t *keys, int8_t *values,
                   int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                   int64_t block_stride, int64_t head_stride) {
  const int64_t data = head_dim * block_size;
#pragma omp parallel for schedule(static) if (tokens > 64)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      int8_t *key_head = keys + block * block_stride + h * head_stride;
      int8_t *value_head = values + block * block_stride + h * head_stride;
      const float key_scale =
          quantize_row(k + t * k_stride + h * head_dim, head_dim, key_head + offset, block_size);
      const float value_scale =
          quantize_row(v + t * v_stride + h * head_dim, head_dim, value_head + offset * head_dim, 1);
      std::memcpy(key_head + data + offset * sizeof(float), &key_scale, sizeof(float));
      std::memcpy(value_head + data + offset * sizeof(float), &value_scale, sizeof(float));
    }
  }
}

}  // namespace

extern "C" {

// 1 when a kernel exists for this shape (else callers use torch's path).
// kind: paged_decode.h's KIND_* bits (query bfloat16, pool int8).
int paged_decode_supported(int kind, int head_dim, int group, int block_size) {
  return pick_for(kind, head_dim, group, block_size) != nullptr;
}

// Returns 0, or -1 for an unsupported shape (nothing written). q rows may
// be strided (a view into the fused qkv output); out is contiguous.
int paged_decode(int kind, const void *q, int64_t q_stride, const void *k, const void *v,
                 const int64_t *block_tables, int64_t table_stride, const int64_t *table_rows,
                 const int64_t *kv_lens, void *out, int num_seqs, int num_heads,
                 int num_kv_heads, int head_dim, int block_size, int64_t block_stride,
                 int64_t head_stride, float scale) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads) return -1;
  Runner runner = pick_for(kind, head_dim, num_heads / num_kv_heads, block_size);
  if (runner == nullptr) return -1;
  Problem p{q,        q_stride,     k,          v,       block_tables, table_stride,
            table_rows, kv_lens,   out,        num_seqs, num_heads,    num_kv_heads,
            block_stride, head_stride, scale};
  runner(p);
  return 0;
}

void write_kv_cache(int element_size, const void *k, int64_t k_stride, const void *v,
                    int64_t v_stride, const int64_t *slots, int64_t tokens, void *keys, void *values,
                    int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                    int64_t block_stride, int64_t head_stride) {
  if (element_size == 2)
    write_kv(static_cast<const uint16_t *>(k), k_stride, static_cast<const uint16_t *>(v), v_stride,
             slots,
             tokens, static_cast<uint16_t *>(keys), static_cast<uint16_t *>(values), num_kv_heads,
             head_dim, block_size, block_stride, head_stride);
  else
    write_kv(static_cast<const uint32_t *>(k), k_stride, static_cast<const uint32_t *>(v), v_stride,
             slots,
             tokens, static_cast<uint32_t *>(keys), static_cast<uint32_t *>(values), num_kv_heads,
             head_dim, block_size, block_stride, head_stride);
}

// k and v (element_size 2: bfloat16, 4: float32) quantized into an int8
// pool; strides in elements of their own type (the pool's are bytes).
void write_kv_cache_int8(int element_size, const void *k, int64_t k_stride, const void *v,
                         int64_t v_stride, const int64_t *slots, int64_t tokens, void *keys,
                         void *values, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                         int64_t block_stride, int64_t head_stride) {
  int8_t *key_pool = static_cast<int8_t *>(keys), *value_pool = static_cast<int8_t *>(values);
  if (element_size == 2)
    write_kv_int8(static_cast<const uint16_t *>(k), k_stride, static_cast<const uint16_t *>(v),
                  v_stride, slots, tokens, key_pool, value_pool, num_kv_heads, head_dim,
                  block_size, block_stride, head_stride);
  else
    write_kv_int8(static_cast<const float *>(k), k_stride, static_cast<const float *>(v), v_stride,
                  slots, tokens, key_pool, value_pool, num_kv_heads, head_dim, block_size,
                  block_stride, head_stride);
}

}  // extern "C"
