// Shared by paged_decode.cpp (portable kernel, dispatch, C API) and
// paged_decode_avx512.cpp (the AVX-512 kernel). See paged_decode.cpp for
// the layouts.

#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace paged {

struct Problem {
  const void *q;
  int64_t q_stride;  // elements between two sequences' query rows
  const void *k, *v;
  const int64_t *block_tables;
  int64_t table_stride;
  const int64_t *table_rows;
  const int64_t *kv_lens;
  void *out;
  int num_seqs, num_heads, num_kv_heads;
  int64_t block_stride, head_stride;
  float scale;
};

using Runner = void (*)(const Problem &);

// Consecutive query rows that read the same blocks (a verification's draft
// positions, a deterministic step's chunk), processed together so that each
// block is read from memory once for all of them. table: the longest row's.
struct RowGroup {
  int first, count;
  const int64_t *table;
};

// At most this many rows per group: each row keeps its own scores, and
// groups are the unit of work shared between threads.
constexpr int MAX_GROUP_ROWS = 8;

std::vector<RowGroup> group_rows(const Problem &p, int block_size);

// The AVX-512 kernel for this kind and shape, or nullptr (no AVX-512 at
// build time, or a shape without an instance). The int8 pools' instances
// are compiled in their own file (paged_decode_avx512_int8.cpp), in
// parallel with the others.
Runner pick_avx512(int kind, int head_dim, int group, int block_size);
Runner pick_avx512_int8(int kind, int head_dim, int group, int block_size);

// bfloat16 is the top half of a float32.
inline float load1(const uint16_t *p) {
  uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float load1(const float *p) { return *p; }
inline float load1(const int8_t *p) { return *p; }

// An int8 pool (kv_cache_dtype="int8") read by queries of type Q (bfloat16
// as uint16_t, or float). Per block and kv head, the int8 keys
// ([HEAD_DIM][BLOCK]) or values ([BLOCK][HEAD_DIM]) are followed by BLOCK
// float32 scales, one per token: x = q * scale (symmetric, scale = absmax /
// 127, written by write_kv_cache_int8). With the scales inside the block,
// swaps, copy-on-write and prefix-cache copies move them with their data.
template <typename Q>
struct Int8KV {};

// A kernel's type parameter T names the query/output and the pool element.
template <typename T>
struct Types {
  using query = T;
  using cache = T;
  static constexpr bool int8 = false;
};
template <typename Q>
struct Types<Int8KV<Q>> {
  using query = Q;
  using cache = int8_t;
  static constexpr bool int8 = true;
};

// The scales after an int8 block's data.
template <int HEAD_DIM, int BLOCK>
inline const float *block_scales(const int8_t *data) {
  return reinterpret_cast<const float *>(data + HEAD_DIM * BLOCK);
}

// Bytes of one (block, kv head) of a pool of T.
template <typename T, int HEAD_DIM, int BLOCK>
constexpr int64_t head_bytes() {
  using KV = typename Types<T>::cache;
  return HEAD_DIM * BLOCK * sizeof(KV) + (Types<T>::int8 ? BLOCK * sizeof(float) : 0);
}

// What paged_decode's `kind` argument selects: the query dtype (bit 0:
// bfloat16, else float32) and the pool's (bit 1: int8 with scales).
constexpr int KIND_BF16 = 1, KIND_INT8 = 2;

// Round to nearest even, as torch's float -> bfloat16 cast does (not
// vcvtneps2bf16, which flushes subnormals).
inline void store1(uint16_t *p, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
    *p = static_cast<uint16_t>((bits >> 16) | 0x40);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *p = static_cast<uint16_t>(bits >> 16);
}
inline void store1(float *p, float f) { *p = f; }

// The shapes a kernel is instantiated for: Kernel::run<T, GROUP, HEAD_DIM,
// BLOCK> with T uint16_t (bfloat16), float or Int8KV of either, GROUP 1..8, HEAD_DIM 64 or
// 128, BLOCK 16 or 32 (template parameters, so accumulators stay in
// registers). pick_shape gives nullptr for any other shape.
namespace dispatch {

template <typename Kernel, typename T, int HEAD_DIM, int BLOCK>
Runner pick_group(int group) {
  switch (group) {
    case 1: return Kernel::template run<T, 1, HEAD_DIM, BLOCK>;
    case 2: return Kernel::template run<T, 2, HEAD_DIM, BLOCK>;
    case 3: return Kernel::template run<T, 3, HEAD_DIM, BLOCK>;
    case 4: return Kernel::template run<T, 4, HEAD_DIM, BLOCK>;
    case 5: return Kernel::template run<T, 5, HEAD_DIM, BLOCK>;
    case 6: return Kernel::template run<T, 6, HEAD_DIM, BLOCK>;
    case 7: return Kernel::template run<T, 7, HEAD_DIM, BLOCK>;
    case 8: return Kernel::template run<T, 8, HEAD_DIM, BLOCK>;
    default: return nullptr;
  }
}

template <typename Kernel, typename T, int BLOCK>
Runner pick_head_dim(int head_dim, int group) {
  switch (head_dim) {
    case 64: return pick_group<Kernel, T, 64, BLOCK>(group);
    case 128: return pick_group<Kernel, T, 128, BLOCK>(group);
    default: return nullptr;
  }
}

template <typename Kernel, typename T>
Runner pick_block(int head_dim, int group, int block_size) {
  switch (block_size) {
    case 16: return pick_head_dim<Kernel, T, 16>(head_dim, group);
    case 32: return pick_head_dim<Kernel, T, 32>(head_dim, group);
    default: return nullptr;
  }
}

}  // namespace dispatch

template <typename Kernel>
Runner pick_shape(int kind, int head_dim, int group, int block_size) {
  switch (kind) {
    case 0: return dispatch::pick_block<Kernel, float>(head_dim, group, block_size);
    case KIND_BF16: return dispatch::pick_block<Kernel, uint16_t>(head_dim, group, block_size);
    case KIND_INT8: return dispatch::pick_block<Kernel, Int8KV<float>>(head_dim, group, block_size);
    case KIND_INT8 | KIND_BF16:
      return dispatch::pick_block<Kernel, Int8KV<uint16_t>>(head_dim, group, block_size);
    default: return nullptr;
  }
}

}  // namespace paged
