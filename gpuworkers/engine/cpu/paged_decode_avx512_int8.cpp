// The AVX-512 decode kernel's instances for int8 pools (kv_cache_dtype
// "int8"): int8 keys and values widened to float32 for FMAs, each block's
// scores multiplied by its keys' scales, each value row's weight by its
// scale (paged_decode_avx512_kernel.h). In their own file so that they
// compile in parallel with the bfloat16 and float32 instances.

#include "paged_decode.h"

#ifdef __AVX512F__

#include "paged_decode_avx512_kernel.h"

namespace paged {

Runner pick_avx512_int8(int kind, int head_dim, int group, int block_size) {
  if (!(kind & KIND_INT8)) return nullptr;
  return pick_shape<avx512::Kernel>(kind, head_dim, group, block_size);
}

}  // namespace paged

#else  // no AVX-512: paged_decode.cpp's portable kernel everywhere

namespace paged {
Runner pick_avx512_int8(int, int, int, int) { return nullptr; }
}  // namespace paged

#endif
