// A Llama decoder's whole layer stack for one step whose every token is a
// paged-decode row, in one call: the same kernels, in the same order and on
// the same buffers' layouts as the Python layer loop (models/llama.py with
// the CPU fast paths), so the same bits, without ~10 Python calls per layer.
// At batch 1 those calls cost several times the kernels' own work (a layer
// of the demo model streams ~8 MB of weights in well under a millisecond).
//
// Per layer: input norm (adding the previous layer's output into the
// residual), qkv linear, rotary on q and k, K/V write, paged decode
// attention, o linear, post-attention add-and-norm, gate_up with SwiGLU,
// down. Each kernel parallelises itself (OpenMP, torch's pool).

#include <cstdint>

extern "C" {
// The kernels of the other translation units (amx_linear.cpp,
// dpbf16_linear.cpp, elementwise.cpp, paged_decode.cpp).
void amx_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, const float *,
                     uint16_t *, int64_t);
void amx_swiglu_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, uint16_t *,
                     int64_t);
void dpbf16_linear_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t);
void dpbf16_swiglu_bf16(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, uint16_t *,
                        int64_t);
void rms_norm_bf16(const uint16_t *, uint16_t *, const uint16_t *, uint16_t *, int64_t, int64_t,
                   int64_t, float);
void rotary_bf16(uint16_t *, int64_t, int64_t, int64_t, int64_t, const int64_t *,
                 const uint16_t *, const uint16_t *);
void write_kv_cache(int, const void *, int64_t, const void *, int64_t, const int64_t *, int64_t,
                    void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
int paged_decode(int, const void *, int64_t, const void *, const void *, const int64_t *, int64_t,
                 const int64_t *, const int64_t *, void *, int, int, int, int, int, int64_t,
                 int64_t, float);
}

namespace {

using Linear = void (*)(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *,
                        const float *, uint16_t *, int64_t);
using SwiGlu = void (*)(const uint16_t *, int64_t, int64_t, int64_t, const uint16_t *, uint16_t *,
                        int64_t);

// One layer's weights, as the Python side lays them out: eight pointers.
struct LayerWeights {
  const uint16_t *input_norm;
  const uint16_t *post_attn_norm;
  const uint16_t *qkv;  // packed tiles (tile_linear.py)
  const float *qkv_bias;  // or null
  const uint16_t *o;
  const float *o_bias;
  const uint16_t *gate_up;  // packed with gate and up tiles alternating
  const uint16_t *down;
};

}  // namespace

extern "C" {

// Shapes: hidden, q_size (heads * head_dim), kv_size, intermediate.
// residual [rows][hidden]: the embeddings on entry, the residual stream
// before the last layer's output on return; delta [rows][hidden]: the last
// layer's output (the caller adds it into the final norm). Scratch:
// normed [rows][hidden], qkv [rows][q + 2 kv], attn [rows][q],
// act [rows][intermediate]. cache: [layers][2][blocks][kv_heads][block
// elements] bfloat16, layer_stride and kv_stride in elements. Block
// tables, their row per query row (or null: row i) and kv lengths as the
// paged decode kernel takes them. Returns 0, or -1 if the decode kernel has
// no instance for the shape (nothing sensible written).
int decode_layers_bf16(int use_amx, int64_t num_layers, const LayerWeights *layers, int64_t rows,
                       int64_t hidden, int64_t q_size, int64_t kv_size, int64_t intermediate,
                       float eps, uint16_t *residual, uint16_t *delta, uint16_t *normed,
                       uint16_t *qkv, uint16_t *attn, uint16_t *act, const int64_t *positions,
                       const uint16_t *cos_table, const uint16_t *sin_table, uint16_t *cache,
                       int64_t layer_stride, int64_t kv_stride, const int64_t *slots,
                       const int64_t *block_tables, int64_t table_stride,
                       const int64_t *table_rows, const int64_t *kv_lens, int num_heads,
                       int num_kv_heads, int head_dim, int block_size, float scale) {
  const Linear linear = use_amx ? amx_linear_bf16 : dpbf16_linear_bf16;
  const SwiGlu swiglu = use_amx ? amx_swiglu_bf16 : dpbf16_swiglu_bf16;
  const int64_t qkv_width = q_size + 2 * kv_size;
  const int64_t head_stride = static_cast<int64_t>(head_dim) * block_size;
  const int64_t block_stride = num_kv_heads * head_stride;
  for (int64_t i = 0; i < num_layers; ++i) {
    const LayerWeights &w = layers[i];
    // Layer 0 normalises the embeddings; later layers first add the
    // previous layer's output into the residual (add_and_norm).
    if (i == 0)
      rms_norm_bf16(residual, nullptr, w.input_norm, normed, rows, hidden, hidden, eps);
    else
      rms_norm_bf16(delta, residual, w.input_norm, normed, rows, hidden, hidden, eps);
    linear(normed, rows, hidden, hidden, w.qkv, w.qkv_bias, qkv, qkv_width);
    // q's and k's heads are adjacent in each qkv row: one rotary call.
    rotary_bf16(qkv, rows, qkv_width, (q_size + kv_size) / head_dim, head_dim, positions,
                cos_table, sin_table);
    uint16_t *keys = cache + i * layer_stride;
    uint16_t *values = keys + kv_stride;
    write_kv_cache(2, qkv + q_size, qkv_width, qkv + q_size + kv_size, qkv_width, slots, rows, keys,
                   values, num_kv_heads, head_dim, block_size, block_stride, head_stride);
    if (paged_decode(1, qkv, qkv_width, keys, values, block_tables, table_stride, table_rows,
                     kv_lens, attn, static_cast<int>(rows), num_heads, num_kv_heads, head_dim,
                     block_size, block_stride, head_stride, scale))
      return -1;
    linear(attn, rows, q_size, q_size, w.o, w.o_bias, delta, hidden);
    rms_norm_bf16(delta, residual, w.post_attn_norm, normed, rows, hidden, hidden, eps);
    swiglu(normed, rows, hidden, hidden, w.gate_up, act, intermediate);
    linear(act, rows, intermediate, intermediate, w.down, nullptr, delta, hidden);
  }
  return 0;
}

}  // extern "C"
