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
//
// The linears are bfloat16 tiles or weight-only int8 ones (int8_linear.py:
// the same tiles over int8 weights with a scale per column), on AMX or
// AVX512_BF16; the pool is bfloat16 or int8 with a scale per token inside
// each block (attention/kv_int8.py). With both int8, a batch-1 step reads
// about half the bytes of bfloat16 weights, and that is the point: the
// Python loop's overhead would otherwise eat what the smaller weights save.

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
void amx_linear_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                     const float *, uint16_t *, int64_t);
void amx_swiglu_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                     uint16_t *, int64_t);
void dpbf16_linear_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                        const float *, uint16_t *, int64_t);
void dpbf16_swiglu_int8(const uint16_t *, int64_t, int64_t, int64_t, const int8_t *, const float *,
                        uint16_t *, int64_t);
void rms_norm_bf16(const uint16_t *, uint16_t *, const uint16_t *, uint16_t *, int64_t, int64_t,
                   int64_t, float);
void rotary_bf16(uint16_t *, int64_t, int64_t, int64_t, int64_t, const int64_t *,
                 const uint16_t *, const uint16_t *);
void write_kv_cache(int, const void *, int64_t, const void *, int64_t, const int64_t *, int64_t,
                    void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
void write_kv_cache_int8(int, const void *, int64_t, const void *, int64_t, const int64_t *,
                         int64_t, void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t);
int paged_decode(int, const void *, int64_t, const void *, const void *, const int64_t *, int64_t,
                 const int64_t *, const int64_t *, void *, int, int, int, int, int, int64_t,
                 int64_t, float);
}

namespace {

// Linear kinds (decode_layers.py's LINEAR_KINDS): the tile instruction and
// the weights' type.
constexpr int DPBF16_BF16 = 0, AMX_BF16 = 1, DPBF16_INT8 = 2, AMX_INT8 = 3;
// paged_decode.h's KIND_* bits.
constexpr int KIND_BF16 = 1, KIND_INT8 = 2;

// One layer's weights, as the Python side lays them out: twelve pointers.
// The packed weights are bfloat16 or int8 tiles (tile_linear.py); an int8
// linear's scales are float32, one per column in the tiles' order (null
// for bfloat16 weights).
struct LayerWeights {
  const uint16_t *input_norm;
  const uint16_t *post_attn_norm;
  const void *qkv;
  const float *qkv_bias;  // or null
  const void *o;
  const float *o_bias;
  const void *gate_up;  // packed with gate and up tiles alternating
  const void *down;
  const float *qkv_scales;
  const float *o_scales;
  const float *gate_up_scales;
  const float *down_scales;
};

// One of the four linear kinds behind one call shape.
struct Linears {
  int kind;

  void linear(const uint16_t *x, int64_t rows, int64_t in, const void *w, const float *scales,
              const float *bias, uint16_t *out, int64_t out_features) const {
    const auto *bf16 = static_cast<const uint16_t *>(w);
    const auto *int8 = static_cast<const int8_t *>(w);
    switch (kind) {
      case AMX_BF16: amx_linear_bf16(x, rows, in, in, bf16, bias, out, out_features); break;
      case DPBF16_BF16: dpbf16_linear_bf16(x, rows, in, in, bf16, bias, out, out_features); break;
      case AMX_INT8: amx_linear_int8(x, rows, in, in, int8, scales, bias, out, out_features); break;
      default: dpbf16_linear_int8(x, rows, in, in, int8, scales, bias, out, out_features);
    }
  }

  void swiglu(const uint16_t *x, int64_t rows, int64_t in, const void *w, const float *scales,
              uint16_t *out, int64_t width) const {
    const auto *bf16 = static_cast<const uint16_t *>(w);
    const auto *int8 = static_cast<const int8_t *>(w);
    switch (kind) {
      case AMX_BF16: amx_swiglu_bf16(x, rows, in, in, bf16, out, width); break;
      case DPBF16_BF16: dpbf16_swiglu_bf16(x, rows, in, in, bf16, out, width); break;
      case AMX_INT8: amx_swiglu_int8(x, rows, in, in, int8, scales, out, width); break;
      default: dpbf16_swiglu_int8(x, rows, in, in, int8, scales, out, width);
    }
  }
};

}  // namespace

extern "C" {

// linear_kind: one of the four above; kv_int8: the pool is int8 (bytes,
// with its scales) rather than bfloat16. Shapes: hidden, q_size (heads *
// head_dim), kv_size, intermediate. residual [rows][hidden]: the
// embeddings on entry, the residual stream before the last layer's output
// on return; delta [rows][hidden]: the last layer's output (the caller
// adds it into the final norm). Scratch: normed [rows][hidden], qkv
// [rows][q + 2 kv], attn [rows][q], act [rows][intermediate]. cache:
// [layers][2][blocks][kv_heads][block elements], layer_stride, kv_stride,
// block_stride and head_stride in the pool's elements (bfloat16, or bytes
// for int8). Block tables, their row per query row (or null: row i) and kv
// lengths as the paged decode kernel takes them. Returns 0, or -1 if the
// decode kernel has no instance for the shape (nothing sensible written).
int decode_layers(int linear_kind, int kv_int8, int64_t num_layers, const LayerWeights *layers,
                  int64_t rows, int64_t hidden, int64_t q_size, int64_t kv_size,
                  int64_t intermediate, float eps, uint16_t *residual, uint16_t *delta,
                  uint16_t *normed, uint16_t *qkv, uint16_t *attn, uint16_t *act,
                  const int64_t *positions, const uint16_t *cos_table, const uint16_t *sin_table,
                  void *cache, int64_t layer_stride, int64_t kv_stride, int64_t block_stride,
                  int64_t head_stride, const int64_t *slots, const int64_t *block_tables,
                  int64_t table_stride, const int64_t *table_rows, const int64_t *kv_lens,
                  int num_heads, int num_kv_heads, int head_dim, int block_size, float scale) {
  const Linears tiles{linear_kind};
  const int64_t qkv_width = q_size + 2 * kv_size;
  const int64_t element = kv_int8 ? 1 : 2;
  const int attention_kind = KIND_BF16 | (kv_int8 ? KIND_INT8 : 0);
  auto *pool = static_cast<char *>(cache);
  for (int64_t i = 0; i < num_layers; ++i) {
    const LayerWeights &w = layers[i];
    // Layer 0 normalises the embeddings; later layers first add the
    // previous layer's output into the residual (add_and_norm).
    if (i == 0)
      rms_norm_bf16(residual, nullptr, w.input_norm, normed, rows, hidden, hidden, eps);
    else
      rms_norm_bf16(delta, residual, w.input_norm, normed, rows, hidden, hidden, eps);
    tiles.linear(normed, rows, hidden, w.qkv, w.qkv_scales, w.qkv_bias, qkv, qkv_width);
    // q's and k's heads are adjacent in each qkv row: one rotary call.
    rotary_bf16(qkv, rows, qkv_width, (q_size + kv_size) / head_dim, head_dim, positions,
                cos_table, sin_table);
    char *keys = pool + i * layer_stride * element;
    char *values = keys + kv_stride * element;
    (kv_int8 ? write_kv_cache_int8 : write_kv_cache)(
        2, qkv + q_size, qkv_width, qkv + q_size + kv_size, qkv_width, slots, rows, keys, values,
        num_kv_heads, head_dim, block_size, block_stride, head_stride);
    if (paged_decode(attention_kind, qkv, qkv_width, keys, values, block_tables, table_stride,
                     table_rows, kv_lens, attn, static_cast<int>(rows), num_heads, num_kv_heads,
                     head_dim, block_size, block_stride, head_stride, scale))
      return -1;
    tiles.linear(attn, rows, q_size, w.o, w.o_scales, w.o_bias, delta, hidden);
    rms_norm_bf16(delta, residual, w.post_attn_norm, normed, rows, hidden, hidden, eps);
    tiles.swiglu(normed, rows, hidden, w.gate_up, w.gate_up_scales, act, intermediate);
    tiles.linear(act, rows, intermediate, w.down, w.down_scales, nullptr, delta, hidden);
  }
  return 0;
}

}  // extern "C"
