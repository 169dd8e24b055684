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

/* On AVX-512, where the pool is of the model's dtype and a head is whole 16-float vectors, a block's scores and
 * values go through explicit 512-bit vectors: each key is one multiply-add chain per query head, and 16 keys'
 * chains are summed across lanes together, where the compiler's code for the loops in attend() (256-bit vectors,
 * a horizontal sum per key and query head, accumulators spilled) stays for every other case. With the prefetch
 * below, bf16, 9 heads over 3 KV heads of 64, 64 rows of ~240 tokens: 25-28 ns a key and KV head from cache
 * against 33, 42-44 from memory against 48-50 (one core of the 2-core Xeon). */
#if defined(__AVX512F__) && !defined(KV_INT8) && HEAD_DIM % 16 == 0
#include <immintrin.h>
#define VECTOR_BLOCKS 1
#define VECS (HEAD_DIM / 16)

static inline __m512 load16(const kv_elem *p) {
#ifdef ELEM_BF16
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
    return _mm512_loadu_ps(p);
#endif
}

/* Lane j of the result: the sum of v[j]'s 16 lanes. */
static inline __m512 sum_across(const __m512 v[16]) {
    __m512 x[8], z[4];
    for (int k = 0; k < 8; ++k) /* per 128-bit chunk: (a0+a2, b0+b2, a1+a3, b1+b3) */
        x[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; ++k) /* per chunk: its 4 lanes' sum for each of 4 keys */
        z[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* scores[g * n + i] = qf[g] . keys[i] for the block's keys lo <= i < n. */
static void block_scores(const float qf[GROUP][HEAD_DIM], const kv_elem *keys, int64_t lo, int64_t n,
                         float *scores) {
    __m512 part[GROUP][16];
    for (int64_t i0 = lo; i0 < n; i0 += 16) {
        const int m = n - i0 < 16 ? (int)(n - i0) : 16;
        for (int j = 0; j < 16; ++j) {
            if (j >= m) {
                for (int g = 0; g < GROUP; ++g) part[g][j] = _mm512_setzero_ps();
                continue;
            }
            __m512 k[VECS];
            for (int v = 0; v < VECS; ++v) k[v] = load16(keys + (i0 + j) * HEAD_DIM + v * 16);
            for (int g = 0; g < GROUP; ++g) {
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qf[g]), k[0]);
                for (int v = 1; v < VECS; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qf[g] + v * 16), k[v], acc);
                part[g][j] = acc;
            }
        }
        const __mmask16 keep = (__mmask16)((1u << m) - 1u);
        for (int g = 0; g < GROUP; ++g) _mm512_mask_storeu_ps(scores + g * n + i0, keep, sum_across(part[g]));
    }
}

/* acc[g] += scores[g * n + i] * values[i] for the block's keys lo <= i < n. */
static void block_values(float acc[GROUP][HEAD_DIM], const kv_elem *values, int64_t lo, int64_t n,
                         const float *scores) {
    for (int g0 = 0; g0 < GROUP; g0 += 4) { /* at most 4 query heads' accumulators in registers at once */
        const int gs = GROUP - g0 < 4 ? GROUP - g0 : 4;
        __m512 sum[4][VECS];
        for (int g = 0; g < gs; ++g)
            for (int v = 0; v < VECS; ++v) sum[g][v] = _mm512_loadu_ps(acc[g0 + g] + v * 16);
        for (int64_t i = lo; i < n; ++i) {
            __m512 row[VECS];
            for (int v = 0; v < VECS; ++v) row[v] = load16(values + i * HEAD_DIM + v * 16);
            for (int g = 0; g < gs; ++g) {
                const __m512 w = _mm512_set1_ps(scores[(g0 + g) * n + i]);
                for (int v = 0; v < VECS; ++v) sum[g][v] = _mm512_fmadd_ps(w, row[v], sum[g][v]);
            }
        }
        for (int g = 0; g < gs; ++g)
            for (int v = 0; v < VECS; ++v) _mm512_storeu_ps(acc[g0 + g] + v * 16, sum[g][v]);
    }
}
#endif

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
#ifdef VECTOR_BLOCKS
    (void)row, (void)k_scale_head, (void)v_scale_head; /* the vectors hold the rows; the pool has no scales */
#endif
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
    for (int64_t t = first - first % block_size; t < len; t += block_size) {
        const int64_t first_slot = (int64_t)table[t / block_size] * block_size, offset = first_slot * HEAD_DIM;
        const kv_elem *keys = k_head + offset, *values = v_head + offset;
        const int64_t n = len - t < block_size ? len - t : block_size;
        const int64_t lo = t < first ? first - t : 0;
        /* The first block asks for the next PREFETCH_BLOCKS; each later one only for the block that far ahead. */
        for (int64_t ahead = t <= first ? 1 : PREFETCH_BLOCKS; ahead <= PREFETCH_BLOCKS; ++ahead) {
            const int64_t next = t + ahead * block_size;
            if (next >= len) break;
            const int64_t at = (int64_t)table[next / block_size] * block_size * HEAD_DIM;
            const int64_t m = len - next < block_size ? len - next : block_size;
            prefetch_block(k_head + at, m);
            prefetch_block(v_head + at, m);
        }
#ifdef VECTOR_BLOCKS
        block_scores((const float(*)[HEAD_DIM])qf, keys, lo, n, scores);
#else
        for (int64_t i = lo; i < n; ++i) {
            for (int d = 0; d < HEAD_DIM; ++d) row[d] = load_kv(keys[i * HEAD_DIM + d]);
            const float key_scale = load_scale(k_scale_head, first_slot + i);
            for (int g = 0; g < GROUP; ++g) {
                float s = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) s += qf[g][d] * row[d];
                scores[g * n + i] = s * key_scale;
            }
        }
#endif
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
#ifdef VECTOR_BLOCKS
        block_values(acc, values, lo, n, scores);
#else
        for (int64_t i = lo; i < n; ++i) {
            for (int d = 0; d < HEAD_DIM; ++d) row[d] = load_kv(values[i * HEAD_DIM + d]);
            const float value_scale = load_scale(v_scale_head, first_slot + i);
            for (int g = 0; g < GROUP; ++g) {
                const float w = scores[g * n + i] * value_scale;
                for (int d = 0; d < HEAD_DIM; ++d) acc[g][d] += w * row[d];
            }
        }
#endif
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
