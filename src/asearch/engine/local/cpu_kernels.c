/* CPU kernels of the in-process engine (float32), its decode step and weight loader, built by cpu_kernels.py.

   decode_attention: RoPE, the K/V write and attention for one new token per row, grouped-query heads. At
   decode batch sizes the step is bound by reading the KV cache; torch's flash kernel spends about as long
   again in two tiny GEMM calls per (row, KV head). This kernel reads each row's keys once for all the query
   heads that share them, and prefetches the next (row, KV head)'s keys and values while it computes.

   rms_norm: RMSNorm of each row in one pass (torch's CPU rms_norm is five ops).

   sample_rows: the sampler's temperature, log-softmax and inverse-CDF draw in two passes over each row.

   transpose_to_f32: a float32 or bfloat16 matrix stored transposed as float32, for the weight loader
   (HF's (out, in) projections into the engine's (in, out) ones). torch's strided copy goes element by
   element through the source's columns; this one moves 8 x 8 tiles.

   Compiled with reassociation (vectorised sums) but not -ffast-math: infinities and NaN keep their
   meaning, and denormals are not flushed. */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* glibc's vector expf (libmvec), which math.h declares only under -ffast-math */
float expf(float) __attribute__((__simd__("notinbranch")));

/* out[c] = x[c] * cos[c] + x[(c + d/2) % d] * sin[c]: transformers' rotate_half with its sign folded into sin */
static void rotate(const float *restrict x, const float *restrict cs, int64_t d, float *restrict out) {
  const float *sn = cs + d;
  const int64_t half = d / 2;
  for (int64_t c = 0; c < half; ++c) out[c] = x[c] * cs[c] + x[c + half] * sn[c];
  for (int64_t c = half; c < d; ++c) out[c] = x[c] * cs[c] + x[c - half] * sn[c];
}

/* Attention of G query heads (Q, G x d) over n keys K and values V (row stride s_pos) into O (G x d). */
static void attend(const float *restrict Q, const float *restrict K, const float *restrict V, int64_t s_pos,
                   int64_t n, int64_t G, int64_t d, float scale, const float *NK, const float *NV,
                   int64_t next_n, float *restrict scores, float *restrict O) {
  for (int64_t j = 0; j < n; ++j) {
    const float *kj = K + j * s_pos;
    /* The next (row, head) block, requested while this one computes: the hardware prefetcher alone
       stalls at every new block (the step's attention was about 30% slower without this). Into L2, not
       L1, which the current block fills (about 2% faster a step). */
    if (j < next_n)
      for (int64_t c = 0; c < d; c += 16) {
        __builtin_prefetch(NK + j * s_pos + c, 0, 1);
        __builtin_prefetch(NV + j * s_pos + c, 0, 1);
      }
    for (int64_t g = 0; g < G; ++g) {
      const float *qg = Q + g * d;
      float acc = 0.f;
      for (int64_t c = 0; c < d; ++c) acc += qg[c] * kj[c];
      scores[g * n + j] = acc * scale;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float *sg = scores + g * n, top = -FLT_MAX, sum = 0.f;
    for (int64_t j = 0; j < n; ++j) top = sg[j] > top ? sg[j] : top;
    for (int64_t j = 0; j < n; ++j) {
      sg[j] = expf(sg[j] - top);
      sum += sg[j];
    }
    const float inv = 1.f / sum;
    for (int64_t j = 0; j < n; ++j) sg[j] *= inv;
    for (int64_t c = 0; c < d; ++c) O[g * d + c] = 0.f;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float *vj = V + j * s_pos;
    for (int64_t g = 0; g < G; ++g) {
      const float p = scores[g * n + j];
      float *og = O + g * d;
      for (int64_t c = 0; c < d; ++c) og[c] += p * vj[c];
    }
  }
}

/* qkv: row b's projections at qkv + b * q_row: nkv * G query heads, nkv key heads, nkv value heads, each d
   contiguous floats, not yet rotated. rope: (positions, 2, d) cos | signed sin. kv: key (row b, KV head h,
   position j) at kv + b * s_slot + h * s_head + j * s_pos, value at + s_kv from there. Row b's token sits at
   position last[b]: its rotated key and its value are written there, then it attends positions 0 .. last[b].
   n_pos: the positions both the cache and rope hold. out: (B, nkv * G * d) contiguous. Returns 0, -1 when
   scratch memory could not be allocated, -2 when a position is outside 0 .. n_pos - 1 (nothing written). */
int decode_attention(const float *restrict qkv, int64_t q_row, const float *restrict rope, float *kv, int64_t s_slot,
                     int64_t s_kv, int64_t s_head, int64_t s_pos, const int64_t *restrict last, int64_t B,
                     int64_t n_pos, int64_t nkv, int64_t G, int64_t d, float scale, float *restrict out) {
  int64_t max_n = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (last[b] < 0 || last[b] >= n_pos) return -2;
    max_n = last[b] + 1 > max_n ? last[b] + 1 : max_n;
  }
  float *scores = malloc(sizeof(float) * (size_t)(G * max_n + nkv * G * d));
  if (!scores) return -1;
  float *q = scores + G * max_n; /* the row's rotated query heads */
  const int64_t nh = nkv * G;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = last[b] + 1;
    const float *row = qkv + b * q_row, *cs = rope + last[b] * 2 * d;
    for (int64_t h = 0; h < nh; ++h) rotate(row + h * d, cs, d, q + h * d);
    for (int64_t h = 0; h < nkv; ++h) {
      float *K = kv + b * s_slot + h * s_head + last[b] * s_pos, *V = K + s_kv;
      rotate(row + (nh + h) * d, cs, d, K);
      for (int64_t c = 0; c < d; ++c) V[c] = row[(nh + nkv + h) * d + c];
    }
    for (int64_t h = 0; h < nkv; ++h) {
      const float *K = kv + b * s_slot + h * s_head, *V = K + s_kv;
      const int64_t nb = h + 1 < nkv ? b : b + 1, next_h = h + 1 < nkv ? h + 1 : 0;
      const int64_t next_n = nb < B ? last[nb] + 1 : 0;
      const float *NK = kv + nb * s_slot + next_h * s_head;
      attend(q + h * G * d, K, V, s_pos, n, G, d, scale, NK, NK + s_kv, next_n, scores,
             out + (b * nkv + h) * G * d);
    }
  }
  free(scores);
  return 0;
}

/* out (rows, h) contiguous = x * w / sqrt(mean(x^2) + eps) per row; row r of x at x + r * x_row. */
void rms_norm(const float *restrict x, int64_t rows, int64_t h, int64_t x_row, const float *restrict w, float eps,
              float *restrict out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * x_row;
    float *o = out + r * h, ss = 0.f;
    for (int64_t c = 0; c < h; ++c) ss += xr[c] * xr[c];
    const float inv = 1.f / sqrtf(ss / (float)h + eps);
    for (int64_t c = 0; c < h; ++c) o[c] = xr[c] * inv * w[c];
  }
}

/* The largest value of x[0 .. n-1] (-inf when n == 0), in 16 independent lanes so that it vectorises */
static float row_max(const float *restrict x, int64_t n) {
  float lanes[16];
  for (int l = 0; l < 16; ++l) lanes[l] = -INFINITY;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
  float top = -INFINITY;
  for (int l = 0; l < 16; ++l) top = lanes[l] > top ? lanes[l] : top;
  for (; j < n; ++j) top = x[j] > top ? x[j] : top;
  return top;
}

#define SAMPLE_BLOCK 64

/* One token per row of logits (B, V): row b is divided by temperature[b] (0: greedy, the argmax of the
   unscaled row, its first occurrence) and drawn by inverse CDF with the uniform u[b]: the first token whose
   cumulative probability exceeds u[b] times the total, summed in double by blocks of SAMPLE_BLOCK tokens.
   ids[b] gets the token, logprobs[b] its log-softmax under the row's temperature (greedy rows: temperature
   1). Returns 0, or -1 when scratch memory could not be allocated. */
int sample_rows(const float *restrict logits, int64_t B, int64_t V, const float *restrict temperature,
                const double *restrict u, int64_t *restrict ids, float *restrict logprobs) {
  const int64_t n_blocks = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
  float *e = malloc(sizeof(float) * (size_t)V);
  double *block = malloc(sizeof(double) * (size_t)n_blocks);
  if (!e || !block) {
    free(e);
    free(block);
    return -1;
  }
  for (int64_t b = 0; b < B; ++b) {
    const float *x = logits + b * V;
    const int greedy = temperature[b] == 0.f;
    const float t = greedy ? 1.f : temperature[b];
    const float top = row_max(x, V) / t;
    float sum = 0.f;
    for (int64_t j = 0; j < V; ++j) {
      e[j] = expf(x[j] / t - top);
      sum += e[j];
    }
    const float lse = top + logf(sum);
    int64_t pick = 0;
    if (greedy) {
      while (pick < V - 1 && x[pick] / t != top) ++pick;
    } else {
      double total = 0.0;
      for (int64_t k = 0; k < n_blocks; ++k) {
        const int64_t end = (k + 1) * SAMPLE_BLOCK < V ? (k + 1) * SAMPLE_BLOCK : V;
        double s = 0.0;
        for (int64_t j = k * SAMPLE_BLOCK; j < end; ++j) s += (double)e[j];
        block[k] = s;
        total += s;
      }
      const double target = u[b] * total;
      double acc = 0.0;
      int64_t k = 0;
      while (k < n_blocks - 1 && acc + block[k] <= target) acc += block[k++];
      const int64_t end = (k + 1) * SAMPLE_BLOCK < V ? (k + 1) * SAMPLE_BLOCK : V;
      pick = -1;
      for (int64_t j = k * SAMPLE_BLOCK; j < end && pick < 0; ++j) {
        acc += (double)e[j];
        if (acc > target && e[j] > 0.f) pick = j;
      }
      /* rounding (the block's sum in another order) left the target past its last token: the last with mass */
      for (int64_t j = end - 1; pick < 0 && j >= k * SAMPLE_BLOCK; --j)
        if (e[j] > 0.f) pick = j;
      if (pick < 0) pick = 0;
    }
    ids[b] = pick;
    logprobs[b] = x[pick] / t - lse;
  }
  free(e);
  free(block);
  return 0;
}

/* Element k of a float32 (bf16 0) or bfloat16 (bf16 1) array, as float32 (bfloat16 is float32's top half). */
static inline float element_f32(const void *src, int64_t bf16, int64_t k) {
  if (!bf16) return ((const float *)src)[k];
  const uint32_t bits = (uint32_t)((const uint16_t *)src)[k] << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

#ifdef __AVX2__
static inline __m256 load8_f32(const void *src, int64_t bf16, int64_t k) {
  if (!bf16) return _mm256_loadu_ps((const float *)src + k);
  const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + k));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* The 8 x 8 tile at element k of src (row stride s_row), transposed into d (row stride d_row). */
static void transpose_tile8(const void *src, int64_t bf16, int64_t k, int64_t s_row, float *d, int64_t d_row) {
  __m256 r[8], t[8], u[8];
  for (int a = 0; a < 8; ++a) r[a] = load8_f32(src, bf16, k + a * s_row);
  for (int a = 0; a < 8; a += 2) {
    t[a] = _mm256_unpacklo_ps(r[a], r[a + 1]);
    t[a + 1] = _mm256_unpackhi_ps(r[a], r[a + 1]);
  }
  for (int a = 0; a < 8; a += 4) {
    u[a] = _mm256_shuffle_ps(t[a], t[a + 2], 0x44);
    u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], 0xEE);
    u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0x44);
    u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
  }
  for (int a = 0; a < 4; ++a) {
    _mm256_storeu_ps(d + a * d_row, _mm256_permute2f128_ps(u[a], u[a + 4], 0x20));
    _mm256_storeu_ps(d + (a + 4) * d_row, _mm256_permute2f128_ps(u[a], u[a + 4], 0x31));
  }
}
#endif

/* dst[j * d_row + i] = src[i * s_row + j] as float32 for i < rows, j < cols: the (rows, cols) matrix src
   (float32, or bfloat16 where bf16 is 1; row stride s_row elements) stored transposed in dst. By strips of
   32 source columns (32 destination rows, written as sequential streams) and blocks of 64 source rows. */
void transpose_to_f32(const void *src, int64_t bf16, int64_t rows, int64_t cols, int64_t s_row, float *restrict dst,
                      int64_t d_row) {
  for (int64_t j0 = 0; j0 < cols; j0 += 32) {
    const int64_t j1 = j0 + 32 < cols ? j0 + 32 : cols;
    for (int64_t i0 = 0; i0 < rows; i0 += 64) {
      const int64_t i1 = i0 + 64 < rows ? i0 + 64 : rows;
      int64_t i8 = i0, j8 = j0; /* [i0, i8) x [j0, j8): what whole 8 x 8 tiles cover */
#ifdef __AVX2__
      i8 = i0 + (i1 - i0) / 8 * 8;
      j8 = j0 + (j1 - j0) / 8 * 8;
      for (int64_t j = j0; j < j8; j += 8)
        for (int64_t i = i0; i < i8; i += 8)
          transpose_tile8(src, bf16, i * s_row + j, s_row, dst + j * d_row + i, d_row);
#endif
      for (int64_t j = j8; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * d_row + i] = element_f32(src, bf16, i * s_row + j);
      for (int64_t j = j0; j < j8; ++j)
        for (int64_t i = i8; i < i1; ++i) dst[j * d_row + i] = element_f32(src, bf16, i * s_row + j);
    }
  }
}
