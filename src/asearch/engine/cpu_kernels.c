/* CPU kernels of the in-process engine's decode step (float32), built at first use by cpu_kernels.py.

   decode_attention: one query token per row against the row's cached keys, grouped-query heads. At decode
   batch sizes the step is bound by reading the KV cache; torch's flash kernel spends about as long again
   in two tiny GEMM calls per (row, KV head). This kernel reads each row's keys once for all the query
   heads that share them, and prefetches the next (row, KV head)'s keys and values while it computes. */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* q: row b's query heads at q + b * q_row, head (h * G + g) at + (h * G + g) * d, d contiguous.
   kv: keys of (row b, KV head h, position j) at kv + b * s_slot + h * s_head + j * s_pos, values at
   + s_kv from there. Row b attends positions 0 .. last[b]. out: (B, nkv * G * d) contiguous.
   Returns 0, or -1 when scratch memory could not be allocated. */
int decode_attention(const float *restrict q, int64_t q_row, const float *restrict kv, int64_t s_slot,
                     int64_t s_kv, int64_t s_head, int64_t s_pos, const int64_t *restrict last, int64_t B,
                     int64_t nkv, int64_t G, int64_t d, float scale, float *restrict out) {
  int64_t max_n = 0;
  for (int64_t b = 0; b < B; ++b) max_n = last[b] + 1 > max_n ? last[b] + 1 : max_n;
  float *scores = malloc(sizeof(float) * (size_t)(G * max_n + 1));
  if (!scores) return -1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = last[b] + 1;
    for (int64_t h = 0; h < nkv; ++h) {
      const float *K = kv + b * s_slot + h * s_head, *V = K + s_kv;
      const float *Q = q + b * q_row + h * G * d;
      float *O = out + (b * nkv + h) * G * d;
      /* The next (row, head) block, requested while this one computes: the hardware prefetcher alone
         stalls at every new block (measured: the step's attention about 30% slower without this). */
      const int64_t nb = h + 1 < nkv ? b : b + 1, nh = h + 1 < nkv ? h + 1 : 0;
      const int64_t next_n = nb < B ? last[nb] + 1 : 0;
      const float *NK = kv + nb * s_slot + nh * s_head, *NV = NK + s_kv;
      for (int64_t j = 0; j < n; ++j) {
        const float *kj = K + j * s_pos;
        if (j < next_n)
          for (int64_t c = 0; c < d; c += 16) {
            __builtin_prefetch(NK + j * s_pos + c, 0, 3);
            __builtin_prefetch(NV + j * s_pos + c, 0, 3);
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
  }
  free(scores);
  return 0;
}
