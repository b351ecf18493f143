// What every AMX kernel here needs before its first tile instruction: the
// tile configuration's memory layout and the OS's permission. Included
// only where __AMX_TILE__ and __AMX_BF16__ are defined.

#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace amx {

// The 64-byte operand of ldtilecfg (palette 1): bytes per row and rows of
// each of the 8 tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands AMX state to a thread only after the process asks once;
// without it the first tile instruction faults. One answer per process,
// shared by the kernels (inline: one static across translation units).
inline bool amx_permitted() {
  static const bool permitted = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return permitted;
}

// gcc's tile loads and stores are asm statements without a memory
// clobber: the compiler may move ordinary loads and stores across them
// (sink the stores of what a tile load reads, or hoist the loads of what a
// tile store wrote). Between the two kinds of access, this forbids it.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

}  // namespace amx
