// Weight-only int8 for the packed-tile linears (amx_linear.cpp,
// dpbf16_linear.cpp): the weights stay int8 in memory, packed in the
// bfloat16 kernels' tile layout (tile_linear.py's pack_tiles, one byte per
// weight) and are widened to bfloat16 in a buffer of the thread's own,
// which the bfloat16 tile code reads: a chunk at a time (vdpbf16ps, and
// AMX for many rows: a prompt's row blocks all reuse one widened chunk),
// or AMX's tiles one k step at a time for a decode step. A decode step
// streams half the bytes from DRAM; the widening is a few vector
// instructions per 32 weights. Included only where AVX512F and BW are
// defined.
//
// Exact: an integer of magnitude <= 127 has at most 7 significant bits, so
// its float32 has a zero low half and is its own bfloat16 (the top half).

#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

namespace int8_weights {

// `count` int8 (a multiple of 32) -> the same values as bfloat16.
inline void widen(const int8_t *from, uint16_t *to, int64_t count) {
  // Word 2i + 1 of the two vectors in turn: each float's top 16 bits.
  static const __m512i TOP_HALVES = [] {
    alignas(64) uint16_t index[32];
    for (int i = 0; i < 32; ++i) index[i] = static_cast<uint16_t>(2 * i + 1);
    return _mm512_load_si512(index);
  }();
  for (int64_t i = 0; i < count; i += 32) {
    const __m512 low = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(from + i))));
    const __m512 high = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(from + i + 16))));
    _mm512_store_si512(to + i, _mm512_permutex2var_epi16(_mm512_castps_si512(low), TOP_HALVES,
                                                         _mm512_castps_si512(high)));
  }
}

// This thread's widening buffer, at least `elements` bfloat16, 64-byte
// aligned. The OpenMP threads live as long as the process, so each keeps
// its buffer from call to call (no allocation per call).
inline uint16_t *buffer(int64_t elements) {
  thread_local std::vector<uint16_t> storage;
  if (static_cast<int64_t>(storage.size()) < elements + 32) storage.resize(elements + 32);
  const auto address = reinterpret_cast<uintptr_t>(storage.data());
  return reinterpret_cast<uint16_t *>((address + 63) & ~uintptr_t{63});
}

}  // namespace int8_weights
