// Two builds of amx_linear.cpp ("old" from a git revision, "new" from the
// working tree, their entry points renamed at compile time), called
// alternately on the demo model's linear shapes. Built and run by run.sh,
// which says what it prints.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define KERNEL(name)                                                                            \
  extern "C" void name(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, const float *, \
                       uint16_t *, int64_t)
KERNEL(linear_old);
KERNEL(linear_new);
extern "C" int supported_old();

namespace {

using Kernel = void (*)(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t);

struct Shape {
  const char *name;
  int64_t in, out;
};

uint16_t *aligned_bf16(size_t count) {
  return static_cast<uint16_t *>(aligned_alloc(64, (count * 2 + 63) / 64 * 64));
}

}  // namespace

int main(int argc, char **argv) {
  const char *old_label = argc > 1 ? argv[1] : "old";
  std::vector<int64_t> row_counts;
  for (char *t = strtok(argc > 2 ? argv[2] : nullptr, ","); t; t = strtok(nullptr, ","))
    row_counts.push_back(atol(t));
  if (row_counts.empty()) row_counts = {24, 64, 384, 1024};
  if (!supported_old()) {
    puts("no AMX here (or the OS refused it)");
    return 1;
  }
  const Kernel kernels[2] = {linear_old, linear_new};
  const Shape shapes[] = {{"qkv", 576, 960}, {"o", 576, 576}, {"gate_up", 576, 3072}, {"down", 1536, 576}};
  for (const Shape &s : shapes)
    for (int64_t rows : row_counts) {
      const size_t weights = ((s.out + 15) / 16) * 16 * s.in;
      uint16_t *x = aligned_bf16(rows * s.in), *w = aligned_bf16(weights);
      uint16_t *y[2] = {aligned_bf16(rows * s.out), aligned_bf16(rows * s.out)};
      // bfloat16 around 1 (inputs) and +-2^-7 (weights), low mantissa bits random.
      for (int64_t i = 0; i < rows * s.in; ++i) x[i] = 0x3f80 + (rand() & 0x7f);
      for (size_t i = 0; i < weights; ++i) w[i] = 0x3c00 + (rand() & 0x7f) + ((rand() & 1) << 15);
      for (int k = 0; k < 2; ++k) kernels[k](x, rows, s.in, s.in, w, nullptr, y[k], s.out);
      const bool same = !memcmp(y[0], y[1], rows * s.out * 2);
      const int calls = std::max<int64_t>(1, 2000 / rows);
      double best[2] = {1e9, 1e9};
      for (int round = 0; round < 30; ++round)
        for (int k = 0; k < 2; ++k) {
          const auto start = std::chrono::steady_clock::now();
          for (int i = 0; i < calls; ++i) kernels[k](x, rows, s.in, s.in, w, nullptr, y[k], s.out);
          const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
          best[k] = std::min(best[k], took.count() / calls);
        }
      const double products = double((rows + 15) / 16) * ((s.out + 15) / 16) * (s.in / 32);
      printf("%-8s rows %5ld  %s %8.1f us %5.1f ns  tree %8.1f us %5.1f ns  %.2fx%s\n", s.name,
             static_cast<long>(rows), old_label, best[0] * 1e6, best[0] * 1e9 / products,
             best[1] * 1e6, best[1] * 1e9 / products, best[0] / best[1], same ? "" : "  MISMATCH");
      free(x), free(w), free(y[0]), free(y[1]);
    }
}
