// Shared by paged_decode.cpp (portable kernel, dispatch, C API) and
// paged_decode_avx512.cpp (the AVX-512 kernel). See paged_decode.cpp for
// the layouts.

#pragma once

#include <cstdint>
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

// The AVX-512 kernel for this shape, or nullptr (no AVX-512 at build time,
// or a shape without an instance).
Runner pick_avx512(int is_bf16, int head_dim, int group, int block_size);

}  // namespace paged
