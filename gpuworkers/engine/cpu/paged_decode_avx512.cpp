// The paged decode kernel with AVX-512 intrinsics (paged_decode.cpp keeps
// the portable one, used where the compiler has no AVX-512).
//
// Why intrinsics: the portable kernel's score loop is one chain of 64
// dependent multiply-adds per query head and block (latency-bound, not
// memory-bound), and gcc picks 256-bit vectors on AMD. Here:
//   - (int8 pools: paged_decode_avx512_int8.cpp)
//   - bfloat16 pools use vdpbf16ps (paged_decode_bf16.h): two products
//     per lane, no widening; float32 pools (and CPUs without AVX512_BF16)
//     widen bfloat16 by a 16-bit shift and use FMAs;
//   - scores of few heads are split into two interleaved chains (even and
//     odd dims), so the FMA units are fed while memory is read;
//   - exp is a vector polynomial, the softmax tail handled with masks;
//   - blocks are prefetched PREFETCH_AHEAD ahead into L2 (they sit anywhere
//     in the pool, where the hardware prefetcher cannot follow), and the
//     first value blocks while the last key blocks are scored. The bf16
//     kernels issue them a line or a few at a time between their loads:
//     in one burst per block, they filled the core's miss slots and the
//     core stalled on them (perf: about half the kernel's samples on the
//     instruction after prefetcht1) with its arithmetic waiting behind.
//
// A work item is a RowGroup against all kv heads, or, where there are
// fewer than WHOLE_GROUPS_PER_THREAD groups per thread (one long sequence),
// against one kv head so that every thread has work. A block's kv heads are
// contiguous in the pool (6 KB in the demo model): an all-heads item reads
// one run per block rather than three 2 KB pieces at other times. Measured
// on the serving shape (24 sequences of ~500 tokens, 30 layers so K/V come
// from DRAM, 2 threads, kernel call alone): per-head items with one burst
// per block 0.67 ms; per-head items with spread prefetches 0.61-0.63; both
// 0.55-0.57. The prefetch distance (2 to 8 blocks) made no clear difference.
//
// Rows that read the same blocks (RowGroup) are processed together: each
// key and value block is read from memory once, and each load feeds the
// accumulators of a tile of up to 4 rows. Every row still runs its own
// arithmetic, in the same order as when it is alone (per block: its own
// accumulators, the same instruction sequence, its own softmax over its
// own length): a row's bits depend on its query and keys only, never on
// its group, the batch or the threads.

#include "paged_decode.h"

#ifdef __AVX512F__

#include "paged_decode_avx512_kernel.h"

namespace paged {

Runner pick_avx512(int kind, int head_dim, int group, int block_size) {
  if (kind & KIND_INT8) return nullptr;
  return pick_shape<avx512::Kernel>(kind, head_dim, group, block_size);
}

}  // namespace paged

#else  // no AVX-512: paged_decode.cpp's portable kernel everywhere

namespace paged {
Runner pick_avx512(int, int, int, int) { return nullptr; }
}  // namespace paged

#endif
