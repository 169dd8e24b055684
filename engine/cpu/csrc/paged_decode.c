/* Paged attention for rows that each attend over a context already in the KV pool, read where its blocks lie.
 *
 * A row is one query token: a decoding request's, or one of a prefill's that continues a computed context (its
 * own K/V already written to the pool, so its context is the request's first position + 1 tokens). For each
 * (row, KV head) the GROUP query heads that share the KV head are scored against every key of the row's
 * context (its block table maps token t to pool slot table[t / block_size] * block_size + t % block_size), a
 * block at a time with an online softmax in fp32, and the values summed with those weights. Nothing is
 * gathered, padded or masked.
 *
 * A layer's features, as transformers passes them, are per-call arguments tested once per block or row, outside
 * the inner loops: a sliding window (window > 0: the row's last `window` tokens, itself included), logit
 * soft-capping (softcap > 0: score -> softcap * tanh(score / softcap)) and attention sinks (sinks != NULL: one
 * fp32 logit per query head added to the softmax's denominator).
 *
 * engine/cpu/kernel_build.py builds it with the host's compiler for one model's shape (-DHEAD_DIM, -DGROUP, and
 * -DELEM_BF16 for bf16, else float), so every inner loop has a constant trip count and vectorises whole
 * (-O3 -march=native, reassociation allowed); engine/cpu/decode_kernel.py calls it once per layer and step.
 * bf16 is the upper half of a float; results are rounded to nearest even on the way out.
 *
 * With -DKV_INT8 the pool is 8-bit (engine/model/kv_cache.py): int8 codes, and one bf16 scale per (KV head, slot)
 * in k_scale / v_scale ([kv_heads][num_slots]). A key's codes are widened in registers and its dot product
 * multiplied by its scale once; a value's scale is folded into its softmax weight. Without it both are NULL.
 * Where HEAD_DIM is a power of two, that pool's keys are rotated (the Walsh-Hadamard transform H of each row), so
 * the kernel rotates each query the same way and divides by HEAD_DIM (H H = HEAD_DIM I): q . k = qH . kH / HEAD_DIM.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Blocks fetched ahead of the one being read: a context's blocks lie anywhere in the pool, so the hardware's own
 * prefetcher cannot see the next one coming (4 against 1: 13% less time at 128 rows of ~230 tokens). */
#define PREFETCH_BLOCKS 4

#if !defined(HEAD_DIM) || !defined(GROUP)
#error "build with -DHEAD_DIM=<head dim> -DGROUP=<query heads per KV head>"
#endif

#ifdef ELEM_BF16
typedef uint16_t elem;
static inline float load(elem h) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline elem store(float f) {
    union {
        uint32_t u;
        float f;
    } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (elem)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (elem)(v.u >> 16);
}
#else
typedef float elem;
static inline float load(elem x) { return x; }
static inline elem store(float x) { return x; }
#endif

#if defined(KV_INT8) && (HEAD_DIM & (HEAD_DIM - 1)) == 0
#define ROTATED_KEYS 1
#endif

#ifdef KV_INT8
typedef int8_t kv_elem;
static inline float load_kv(kv_elem x) { return (float)x; }
static inline float load_scale(const uint16_t *scales, int64_t i) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)scales[i] << 16;
    return v.f;
}
#else
typedef elem kv_elem;
static inline float load_kv(kv_elem x) { return load(x); }
static inline float load_scale(const uint16_t *scales, int64_t i) { return (void)scales, (void)i, 1.0f; }
#endif

/* e^x for x <= 0 (scores minus their maximum), relative error under 2e-7: x = n ln2 + r, |r| <= ln2 / 2,
 * e^r by its degree-6 Taylor polynomial, 2^n put in the exponent bits. Plain arithmetic, so it vectorises. */
static inline float exp_nonpositive(float x) {
    x = __builtin_fmaxf(x, -87.0f);
    const int32_t i = (int32_t)(x * 1.44269504f - 0.5f);
    const float n = (float)i;
    const float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f +
                                                                                    r * 0.00138888892f)))));
    float scale;
    const int32_t bits = (i + 127) << 23;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* p[t] = e^(p[t] - top) for the n scores of one head, whose maximum is top; returns their sum. */
static float exponentiate(float *restrict p, int64_t n, float top) {
    float sum = 0.0f;
    for (int64_t t = 0; t < n; ++t) {
        p[t] = exp_nonpositive(p[t] - top);
        sum += p[t];
    }
    return sum;
}

static inline void prefetch_block(const kv_elem *rows, int64_t n) {
    const char *bytes = (const char *)rows;
    for (int64_t off = 0; off < n * HEAD_DIM * (int64_t)sizeof(kv_elem); off += 64) __builtin_prefetch(bytes + off);
}

/* One row's query heads [GROUP][HEAD_DIM] of one KV head against its context of len tokens, a block at a time:
 * the block's scores, the running maximum and sum rescaled (online softmax), the block's values summed in, while
 * the next block's keys and values are fetched. */
static void attend(const elem *q, int64_t q_stride_head, const kv_elem *k_head, const kv_elem *v_head,
                   const uint16_t *k_scale_head, const uint16_t *v_scale_head, const int32_t *table, int64_t len,
                   int64_t block_size, float scale, int64_t window, float softcap,
                   const float *sinks, float *scores, elem *out) {
    float qf[GROUP][HEAD_DIM], acc[GROUP][HEAD_DIM], row[HEAD_DIM], best[GROUP], total[GROUP];
    for (int g = 0; g < GROUP; ++g) {
        for (int d = 0; d < HEAD_DIM; ++d) qf[g][d] = load(q[g * q_stride_head + d]) * scale;
        for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] = 0.0f;
        best[g] = -3.0e38f;
        total[g] = 0.0f;
    }
#ifdef ROTATED_KEYS
    /* engine.model.kv_cache.rotate's butterflies; then 1 / HEAD_DIM, a power of two, exactly. */
    for (int g = 0; g < GROUP; ++g) {
        for (int h = 1; h < HEAD_DIM; h *= 2)
            for (int i = 0; i < HEAD_DIM; i += 2 * h)
                for (int j = i; j < i + h; ++j) {
                    const float a = qf[g][j], b = qf[g][j + h];
                    qf[g][j] = a + b;
                    qf[g][j + h] = a - b;
                }
        for (int d = 0; d < HEAD_DIM; ++d) qf[g][d] *= 1.0f / HEAD_DIM;
    }
#endif
    /* A window starts mid-block: the first block read skips its first `lo` tokens. */
    const int64_t first = window > 0 && len > window ? len - window : 0;
    const int64_t start = first - first % block_size;
    for (int64_t t = start; t < len; t += block_size) {
        const int64_t first_slot = (int64_t)table[t / block_size] * block_size, offset = first_slot * HEAD_DIM;
        const kv_elem *keys = k_head + offset, *values = v_head + offset;
        const int64_t n = len - t < block_size ? len - t : block_size;
        const int64_t lo = t < first ? first - t : 0;
        /* The first block asks for the next PREFETCH_BLOCKS in one go; every block (the first too) for the one
         * after those, PREFETCH_BLOCKS + 1 ahead, a key's row at a time beside the reading of its own (the keys'
         * with the scores, the values' with the sums): asked for a whole block at once (64 lines at 64 dims in
         * bf16), or again for blocks already on their way, the prefetches held up the loads and had a third of
         * the kernel's samples. */
        if (t == start)
            for (int64_t ahead = 1; ahead <= PREFETCH_BLOCKS; ++ahead) {
                const int64_t next = t + ahead * block_size;
                if (next >= len) break;
                const int64_t at = (int64_t)table[next / block_size] * block_size * HEAD_DIM;
                const int64_t m = len - next < block_size ? len - next : block_size;
                prefetch_block(k_head + at, m);
                prefetch_block(v_head + at, m);
            }
        const int64_t next = t + (PREFETCH_BLOCKS + 1) * block_size;
        const int64_t next_at = next < len ? (int64_t)table[next / block_size] * block_size * HEAD_DIM : -1;
        const int64_t next_n = next < len ? (len - next < block_size ? len - next : block_size) : 0;
        for (int64_t i = lo; i < n; ++i) {
            if (i < next_n) prefetch_block(k_head + next_at + i * HEAD_DIM, 1);
            for (int d = 0; d < HEAD_DIM; ++d) row[d] = load_kv(keys[i * HEAD_DIM + d]);
            const float key_scale = load_scale(k_scale_head, first_slot + i);
            for (int g = 0; g < GROUP; ++g) {
                float s = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) s += qf[g][d] * row[d];
                scores[g * n + i] = s * key_scale;
            }
        }
        if (softcap > 0.0f)
            for (int g = 0; g < GROUP; ++g)
                for (int64_t i = lo; i < n; ++i) scores[g * n + i] = softcap * tanhf(scores[g * n + i] / softcap);
        for (int g = 0; g < GROUP; ++g) {
            float top = best[g];
            for (int64_t i = lo; i < n; ++i) top = scores[g * n + i] > top ? scores[g * n + i] : top;
            const float rescale = exp_nonpositive(best[g] - top);
            for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] *= rescale;
            total[g] = total[g] * rescale + exponentiate(scores + g * n + lo, n - lo, top);
            best[g] = top;
        }
        for (int64_t i = lo; i < n; ++i) {
            if (i < next_n) prefetch_block(v_head + next_at + i * HEAD_DIM, 1);
            for (int d = 0; d < HEAD_DIM; ++d) row[d] = load_kv(values[i * HEAD_DIM + d]);
            const float value_scale = load_scale(v_scale_head, first_slot + i);
            for (int g = 0; g < GROUP; ++g) {
                const float w = scores[g * n + i] * value_scale;
                for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] += w * row[d];
            }
        }
    }
    if (sinks != NULL)
        for (int g = 0; g < GROUP; ++g) {
            /* The sink joins the denominator only; whichever of it and the scores' maximum is larger is the
             * reference, so e^x is only ever taken of x <= 0. */
            const float top = sinks[g] > best[g] ? sinks[g] : best[g], rescale = exp_nonpositive(best[g] - top);
            for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] *= rescale;
            total[g] = total[g] * rescale + exp_nonpositive(sinks[g] - top);
        }
    for (int g = 0; g < GROUP; ++g) {
        const float inv = 1.0f / total[g];
        for (int d = 0; d < HEAD_DIM; ++d) out[g * HEAD_DIM + d] = store(acc[g][d] * inv);
    }
}

/* Whether a row of len tokens stays inside its table and the pool: reading past them would be a crash, not an
 * error, so it is checked (a compare per block, against the hundreds of multiply-adds each block costs). */
static int within(const int32_t *table, int64_t len, int64_t max_len, int64_t max_blocks, int64_t block_size,
                  int64_t num_slots) {
    if (len < 1 || len > max_len || len > max_blocks * block_size) return 0;
    for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b)
        if (table[b] < 0 || ((int64_t)table[b] + 1) * block_size > num_slots) return 0;
    return 1;
}

/* q: token i's head h at q + i * q_stride_token + h * q_stride_head (HEAD_DIM contiguous); k_cache, v_cache:
 * [kv_heads, num_slots, HEAD_DIM], k_scale, v_scale: [kv_heads, num_slots] with KV_INT8, else NULL; tables: [*, max_blocks]; row r is token rows[r], attends with block table
 * table_of[r] over lens[r] tokens (1 <= lens[r] <= max_len), and writes its heads at out + rows[r] *
 * out_stride_token ([heads, HEAD_DIM] contiguous). window (0: none), softcap (0: none) and sinks ([heads] fp32,
 * or NULL) are the layer's features (see above). 0 on success, 1 where scratch memory ran out, 2 where a row's
 * length or blocks lie outside what it was given (that row is left unwritten). */
int paged_attention_rows(const elem *q, int64_t q_stride_token, int64_t q_stride_head, const kv_elem *k_cache,
                         const kv_elem *v_cache, const uint16_t *k_scale, const uint16_t *v_scale, int64_t num_slots,
                         const int32_t *tables, int64_t max_blocks,
                         const int32_t *rows, const int32_t *table_of, const int32_t *lens, int64_t num_rows,
                         int64_t kv_heads, int64_t block_size, float scale, int64_t max_len, int64_t window,
                         float softcap, const float *sinks, elem *out, int64_t out_stride_token, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scores = malloc(sizeof(float) * (size_t)(GROUP * max_len));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 4)
        for (int64_t work = 0; work < num_rows * kv_heads; ++work) {
            if (scores == NULL) continue;
            const int64_t r = work / kv_heads, kvh = work % kv_heads, token = rows[r];
            if (!within(tables + (int64_t)table_of[r] * max_blocks, lens[r], max_len, max_blocks, block_size,
                        num_slots)) {
#pragma omp atomic write
                failed = 2;
                continue;
            }
            attend(q + token * q_stride_token + kvh * GROUP * q_stride_head, q_stride_head,
                   k_cache + kvh * num_slots * HEAD_DIM, v_cache + kvh * num_slots * HEAD_DIM,
                   k_scale == NULL ? NULL : k_scale + kvh * num_slots, v_scale == NULL ? NULL : v_scale + kvh * num_slots,
                   tables + (int64_t)table_of[r] * max_blocks, lens[r], block_size, scale, window, softcap,
                   sinks == NULL ? NULL : sinks + kvh * GROUP, scores,
                   out + token * out_stride_token + kvh * GROUP * HEAD_DIM);
        }
        free(scores);
    }
    return failed;
}
