/* The LiLiCorr head's greedy proposal for ONE row, fp32, in one plain C call (no framework in between).

Why: at batch 1 the head is ~60 small GEMMs and pointwise chains over S*K = 12..28 nodes of width 128. Even as one
compiled Inductor call it cost about twice as much inside the engine as called back to back (docs/results.md, "CPU
fast paths"), because the target's pass has just flushed the caches of everything it touches: MKL's and Inductor's
code, the framework's objects, its buffers. This is the same computation as heads/lilicorr_fast.py's
_propose_one_row, written as loops over the head's weights (packed once, models/heads/lilicorr_native.py): a few KB
of code and ~1 MB of tables (bf16 panels) are all it reads.
Single-threaded: its GEMMs are (12..28, 128) x (128, 128..384), too small to split over cores.

The reference is the module code (LiLiCorrHead.vectors, LatticeTransformer, lattice_scores_reference,
greedy_walk_reference); the tests compare this with it (tests/parity/test_parity_lilicorr_head.py). Sums run in
another order than torch's (fp32, ~1e-6 relative), so a score within that of another could pick the other
candidate: a different draft, never a different output (the target verifies it). The top-K is exact (value
descending, equal values -> lower id first), as topk_logsoftmax's kernels rank them.

Layouts: every matrix row-major, but a linear layer's weight packed in panels of 16 outputs (see `linear`): one
weight vector of 16 outputs is loaded once per 12 input rows (y[r, j:j+16] += x[r, i] * w[i, j:j+16]), and each
panel is read front to back. Node n = s*K + k.
*/

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

/* the weight table (models/heads/lilicorr_native.py: _table), then L_COUNT entries per lattice layer */
enum {  /* _T: a Linear's weight in panels (see linear), _B its bias */
    W_EMBED_NODES, W_HIDDEN_T, W_HIDDEN_B, W_LN_W, W_LN_B, W_CONF0_T, W_CONF0_B, W_CONF2_T, W_CONF2_B,
    W_SLOT, W_RANK, W_FINAL_NORM, W_FUSE_T, W_FUSE_B, W_OUTIN_T, W_OUTIN_B, W_ANCHOR_T, W_ANCHOR_B,
    W_TPROJ_T, W_TPROJ_B, W_TNORM, W_LAYERS
};
enum { L_ATTN_NORM, L_QKV_T, L_QKV_B, L_PROJ_T, L_PROJ_B, L_BIAS, L_FFN_NORM, L_IN_T, L_IN_B, L_OUT_T, L_OUT_B, L_COUNT };
/* the integer dimensions and the float options (models/heads/lilicorr_native.py: _build) */
enum { D_S, D_V, D_K, D_H, D_HS, D_W, D_D, D_HEADS, D_LAYERS, D_FFN, D_HAS_PROJ, D_LAYERNORM, D_BF16, D_COUNT };
enum { F_PROJ_EPS, F_LN_EPS, F_LAYER_EPS, F_SIGMA, F_COUNT };
#define NUM_FEATURES 5

static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }
static inline v16 splat(float x) { return (v16){0} + x; }
static inline v16 pick(v16i m, v16 a, v16 b) { return (v16)(((v16i)a & m) | ((v16i)b & ~m)); }  /* m ? a : b */

/* exp of 16 lanes (Cephes' expf: a degree-6 polynomial on x - n ln2, times 2^n; ~1 ulp). Inputs are clamped to
   [-87, 88], where 2^n stays a normal float: below -87 the value (< 2e-38) only ever adds to a sum of >= 1. */
static inline v16 exp16(v16 x) {
    x = pick(x > 88.0f, splat(88.0f), x);
    x = pick(x < -87.0f, splat(-87.0f), x);
    v16 fx = x * 1.44269504088896341f + 0.5f;
    v16i n = __builtin_convertvector(fx, v16i);  /* truncation; floor for negative fx below */
    v16 nf = __builtin_convertvector(n, v16);
    n += (v16i)(nf > fx);  /* -1 where truncation rounded up */
    nf = __builtin_convertvector(n, v16);
    x = x - nf * 0.693359375f - nf * -2.12194440e-4f;
    v16 z = x * x;
    v16 y = 1.9875691500e-4f * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    return y * (v16)((n + 127) << 23);
}

/* f over x[0..n) in place, 16 lanes at a time; the tail through a padded copy */
#define MAP_INPLACE(name, body)                                                         \
    static void name(float *x, int n) {                                                 \
        int j = 0;                                                                      \
        for (; j + 16 <= n; j += 16) { v16 v = load16(x + j); store16(x + j, body); }   \
        if (j < n) {                                                                    \
            float pad[16] = {0};                                                        \
            memcpy(pad, x + j, (size_t)(n - j) * sizeof(float));                        \
            v16 v = load16(pad);                                                        \
            store16(pad, body);                                                         \
            memcpy(x + j, pad, (size_t)(n - j) * sizeof(float));                        \
        }                                                                               \
    }
MAP_INPLACE(silu_inplace, v / (1.0f + exp16(-v)))  /* F.silu */
MAP_INPLACE(exp_inplace, exp16(v))

/* y (M, out) = x (M, in) @ W^T + b (out,) (b may be NULL), W packed in panels of 16 outputs: wp[j / 16][i][j % 16]
   (ceil(out / 16) panels, the last zero-padded), so each panel streams through memory once per block of rows.
   In fp32, or in bf16 (the upper half of an fp32: widened exactly) where every weight of the head is a bf16 value,
   as a shipped export's are: half the bytes from DRAM, the same products. */
#define PREFETCH_ROWS 128  /* panel rows ahead (4-8 KB, past the 4 KB page where the hardware prefetcher stops; 32 and 384 were slower) */
#define LINEAR_ROWS(R, LOAD)                                                                        \
    for (; r0 + (R) <= M; r0 += (R)) {                                                              \
        v16 acc[R];                                                                                 \
        _Pragma("GCC unroll 16") for (int r = 0; r < (R); r++) acc[r] = bias;                       \
        for (int i = 0; i < in; i++) {                                                              \
            __builtin_prefetch(panel + (size_t)(i + PREFETCH_ROWS) * 16);                           \
            v16 w = LOAD(i);                                                                        \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R); r++) acc[r] += x[(size_t)(r0 + r) * in + i] * w; \
        }                                                                                           \
        _Pragma("GCC unroll 16") for (int r = 0; r < (R); r++) put(y + (size_t)(r0 + r) * out + j0, acc[r], width); \
    }

/* one row, its sum split over four chains of i (one chain of FMAs would wait on each one's latency) */
#define LINEAR_ROW(LOAD)                                                                            \
    for (; r0 < M; r0++) {                                                                          \
        const float *xr = x + (size_t)r0 * in;                                                      \
        v16 a0 = bias, a1 = splat(0.0f), a2 = splat(0.0f), a3 = splat(0.0f);                        \
        int i = 0;                                                                                  \
        for (; i + 4 <= in; i += 4) {                                                               \
            a0 += xr[i] * LOAD(i); a1 += xr[i + 1] * LOAD(i + 1);                                   \
            a2 += xr[i + 2] * LOAD(i + 2); a3 += xr[i + 3] * LOAD(i + 3);                           \
        }                                                                                           \
        for (; i < in; i++) a0 += xr[i] * LOAD(i);                                                  \
        put(y + (size_t)r0 * out + j0, (a0 + a1) + (a2 + a3), width);                               \
    }

static inline void put(float *y, v16 v, int width) {  /* the first `width` (<= 16) lanes */
    if (width == 16) { store16(y, v); return; }
    float tmp[16];
    store16(tmp, v);
    memcpy(y, tmp, (size_t)width * sizeof(float));
}

static inline v16 widen_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    return (v16)(__builtin_convertvector(h, v16i) << 16);
}

static void linear(const float *x, int M, int in, const void *wp, const float *b, int out, float *y, int bf16) {
    for (int j0 = 0; j0 < out; j0 += 16) {
        int width = out - j0 < 16 ? out - j0 : 16;
        v16 bias = splat(0.0f);
        if (b) { float tmp[16] = {0}; memcpy(tmp, b + j0, (size_t)width * sizeof(float)); bias = load16(tmp); }
        int r0 = 0;
        if (bf16) {
            const uint16_t *panel = (const uint16_t *)wp + (size_t)j0 * in;  /* panel j0 / 16: (in, 16) */
#define LOAD_BF16(i) widen_bf16(panel + (size_t)(i) * 16)
            LINEAR_ROWS(12, LOAD_BF16)
            LINEAR_ROWS(4, LOAD_BF16)
            LINEAR_ROW(LOAD_BF16)
        } else {
            const float *panel = (const float *)wp + (size_t)j0 * in;
#define LOAD_F32(i) load16(panel + (size_t)(i) * 16)
            LINEAR_ROWS(12, LOAD_F32)
            LINEAR_ROWS(4, LOAD_F32)
            LINEAR_ROW(LOAD_F32)
        }
    }
}

static float dot(const float *a, const float *b, int n) {
    v16 acc = splat(0.0f);
    int j = 0;
    for (; j + 16 <= n; j += 16) acc += load16(a + j) * load16(b + j);
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc[l];
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}

/* drafter_layers.RMSNorm: w * (x * rsqrt(mean(x^2) + eps)), each of M rows of width n */
static void rms_rows(const float *x, int M, int n, const float *w, float eps, float *y) {
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * n;
        float inv = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        for (int j = 0; j < n; j++) y[(size_t)r * n + j] = w[j] * (xr[j] * inv);
    }
}

/* x / max(||x||, eps) in place (F.normalize: eps 1e-12; the walk's _unit: 1e-8) */
static void unit_rows(float *x, int M, int n, float eps) {
    for (int r = 0; r < M; r++) {
        float *xr = x + (size_t)r * n;
        float norm = sqrtf(dot(xr, xr, n));
        float inv = 1.0f / (norm > eps ? norm : eps);
        for (int j = 0; j < n; j++) xr[j] *= inv;
    }
}

static int argmax(const float *x, int n) {  /* the first of equal maxima, as torch.argmax */
    int best = 0;
    for (int j = 1; j < n; j++) if (x[j] > x[best]) best = j;
    return best;
}

/* One slot's exact top-k columns of x (V,) (value descending, equal values -> lower id first) and their
   log-softmax values (x - max - log(sum exp(x - max)), as torch.log_softmax). */
static void topk_logsoftmax(const float *x, int V, int k, int64_t *ids, float *logprobs) {
    float vals[64];
    int n = 0;
    for (int j = 0; j < V; j++) {
        float v = x[j];
        if (n == k && !(v > vals[k - 1])) continue;  /* the hot path: one compare */
        int p = n < k ? n : k - 1;
        while (p > 0 && v > vals[p - 1]) {  /* strict: an equal value already kept has a lower id */
            if (p < k) { vals[p] = vals[p - 1]; ids[p] = ids[p - 1]; }
            p--;
        }
        vals[p] = v; ids[p] = j;
        if (n < k) n++;
    }
    v16 vmax = splat(-INFINITY);
    int j = 0;
    for (; j + 16 <= V; j += 16) { v16 v = load16(x + j); vmax = pick(v > vmax, v, vmax); }
    float m = -INFINITY;
    for (int l = 0; l < 16; l++) m = vmax[l] > m ? vmax[l] : m;
    for (; j < V; j++) m = x[j] > m ? x[j] : m;
    v16 acc = splat(0.0f);
    for (j = 0; j + 16 <= V; j += 16) acc += exp16(load16(x + j) - m);
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += acc[l];
    if (j < V) {
        float pad[16];
        for (int l = 0; l < 16; l++) pad[l] = j + l < V ? x[j + l] - m : -INFINITY;
        exp_inplace(pad, 16);
        for (int l = 0; j + l < V; l++) sum += pad[l];
    }
    float lse = logf(sum);
    for (int c = 0; c < k; c++) logprobs[c] = (vals[c] - m) - lse;
}

/* One pre-norm lattice layer (LatticeLayer.forward) on x (N, W) in place. scratch: N * (3W + 2W + F) + N floats. */
static void lattice_layer(float *x, int N, int W, int heads, int F, const float *const *p, float eps, float *scratch,
                          int bf16) {
    float *h = scratch, *qkv = h + (size_t)N * W, *att = qkv + (size_t)N * 3 * W, *ffn = att + (size_t)N * W,
          *scores = ffn + (size_t)N * F;
    int hd = W / heads;
    float scale = 1.0f / sqrtf((float)hd);
    rms_rows(x, N, W, p[L_ATTN_NORM], eps, h);
    linear(h, N, W, p[L_QKV_T], p[L_QKV_B], 3 * W, qkv, bf16);  /* q | k | v, each heads x hd */
    for (int a = 0; a < heads; a++) {
        const float *bias = p[L_BIAS] + (size_t)a * N * N;  /* (heads, N, N) additive */
        for (int i = 0; i < N; i++) {
            const float *q = qkv + (size_t)i * 3 * W + a * hd;
            float m = -INFINITY;
            for (int j = 0; j < N; j++) {
                scores[j] = dot(q, qkv + (size_t)j * 3 * W + W + a * hd, hd) * scale + bias[(size_t)i * N + j];
                m = scores[j] > m ? scores[j] : m;
            }
            for (int j = 0; j < N; j++) scores[j] -= m;
            exp_inplace(scores, N);
            float sum = 0.0f;
            for (int j = 0; j < N; j++) sum += scores[j];
            float *o = att + (size_t)i * W + a * hd;
            for (int e = 0; e < hd; e++) o[e] = 0.0f;
            for (int j = 0; j < N; j++) {
                const float *v = qkv + (size_t)j * 3 * W + 2 * W + a * hd;
                float pj = scores[j] / sum;
                for (int e = 0; e < hd; e++) o[e] += pj * v[e];
            }
        }
    }
    linear(att, N, W, p[L_PROJ_T], p[L_PROJ_B], W, h, bf16);
    for (size_t e = 0; e < (size_t)N * W; e++) x[e] += h[e];
    rms_rows(x, N, W, p[L_FFN_NORM], eps, h);
    linear(h, N, W, p[L_IN_T], p[L_IN_B], F, ffn, bf16);
    silu_inplace(ffn, N * F);
    linear(ffn, N, F, p[L_OUT_T], p[L_OUT_B], W, h, bf16);
    for (size_t e = 0; e < (size_t)N * W; e++) x[e] += h[e];
}

/* scratch floats lilicorr_propose_one_row needs (the caller allocates them once) */
int64_t lilicorr_scratch_floats(const int32_t *dims) {
    int64_t S = dims[D_S], K = dims[D_K], N = S * K, W = dims[D_W], d = dims[D_D], F = dims[D_FFN];
    int64_t layer = N * (5 * W + F) + N;  /* lattice_layer's */
    return 2 * W + S * W + d + N * NUM_FEATURES + 5 * N * W + 2 * N * d + K + S * K + layer;
}

/*
logits (S, V): the drafter's slot logits over its columns; vocab_ids (V,) their token ids (NULL: the column is the id)
slot_hidden (S, H); state: the drafter's fused context (Hs,) when dims[D_HAS_PROJ] (target_proj + target_norm run
here), else the projected target state t (W,). -> tokens (S,) committed, cand (S, K) the candidates' token ids, and
when walk_scores is not NULL each slot's K scores the walk chose from (S, K): the anchor's for slot 0, then those
from the previous pick's out vector (what the tests compare with lattice_scores_reference).
*/
void lilicorr_propose_one_row(const float *logits, const int64_t *vocab_ids, const float *slot_hidden,
                              const float *state, const float *const *w, const int32_t *dims, const float *opts,
                              float *scratch, int64_t *tokens, int64_t *cand, float *walk_scores) {
    const int S = dims[D_S], V = dims[D_V], K = dims[D_K], H = dims[D_H], Hs = dims[D_HS], W = dims[D_W];
    const int d = dims[D_D], heads = dims[D_HEADS], layers = dims[D_LAYERS], F = dims[D_FFN], N = S * K;
    const float sigma = opts[F_SIGMA];
    const int bf16 = dims[D_BF16];  /* the weight panels' format */
    /* scratch, in lilicorr_scratch_floats' order */
    float *t = scratch, *tmp = t + W, *hid = tmp + W, *anchor = hid + (size_t)S * W, *feat = anchor + d,
          *x = feat + (size_t)N * NUM_FEATURES, *conf = x + (size_t)N * W, *cat = conf + (size_t)N * W,
          *oi = cat + (size_t)N * 3 * W, *path_scores = oi + (size_t)N * 2 * d, *logprobs = path_scores + K,
          *layer_scratch = logprobs + (size_t)S * K;
    int64_t cols[64 * 64];  /* (S, K) columns; S, K <= 64 (lilicorr_native.py checks) */

    /* LiLiCorrHead.target_projection ("fused": rms(Linear(context)))  */
    if (dims[D_HAS_PROJ]) {
        linear(state, 1, Hs, w[W_TPROJ_T], w[W_TPROJ_B], W, tmp, bf16);
        rms_rows(tmp, 1, W, w[W_TNORM], opts[F_PROJ_EPS], t);
    } else {
        memcpy(t, state, (size_t)W * sizeof(float));
    }
    /* top-K and the five confidence features (topk_logsoftmax.candidate_features), LayerNorm'd */
    for (int s = 0; s < S; s++) {
        topk_logsoftmax(logits + (size_t)s * V, V, K, cols + s * K, logprobs + s * K);
        for (int k = 0; k < K; k++) {
            float lp = logprobs[s * K + k], *f = feat + (size_t)(s * K + k) * NUM_FEATURES;
            float e = lp;
            exp_inplace(&e, 1);
            f[0] = lp; f[1] = e; f[2] = lp - logprobs[s * K];
            f[3] = K > 1 ? (float)k / (float)(K - 1) : 0.0f; f[4] = k == 0 ? 1.0f : 0.0f;
            if (dims[D_LAYERNORM]) {  /* F.layer_norm over the 5: biased variance */
                float mean = 0.0f, var = 0.0f;
                for (int c = 0; c < NUM_FEATURES; c++) mean += f[c];
                mean /= NUM_FEATURES;
                for (int c = 0; c < NUM_FEATURES; c++) var += (f[c] - mean) * (f[c] - mean);
                float inv = 1.0f / sqrtf(var / NUM_FEATURES + opts[F_LN_EPS]);
                for (int c = 0; c < NUM_FEATURES; c++) f[c] = (f[c] - mean) * inv * w[W_LN_W][c] + w[W_LN_B][c];
            }
            cand[s * K + k] = vocab_ids ? vocab_ids[cols[s * K + k]] : cols[s * K + k];
        }
    }
    /* nodes: embed_proj(E[c]) (a precomputed row per column) + hidden_proj(h_s) + conf_mlp(f) + slot[s] + rank[k] */
    linear(slot_hidden, S, H, w[W_HIDDEN_T], w[W_HIDDEN_B], W, hid, bf16);
    linear(feat, N, NUM_FEATURES, w[W_CONF0_T], w[W_CONF0_B], W, cat, bf16);
    silu_inplace(cat, N * W);
    linear(cat, N, W, w[W_CONF2_T], w[W_CONF2_B], W, conf, bf16);
    for (int s = 0; s < S; s++)
        for (int k = 0; k < K; k++) {
            float *xn = x + (size_t)(s * K + k) * W;
            const float *e = w[W_EMBED_NODES] + (size_t)cols[s * K + k] * W, *hs = hid + (size_t)s * W,
                        *cf = conf + (size_t)(s * K + k) * W, *sl = w[W_SLOT] + (size_t)s * W, *rk = w[W_RANK] + (size_t)k * W;
            for (int j = 0; j < W; j++) xn[j] = e[j] + hs[j] + cf[j] + sl[j] + rk[j];
        }
    for (int l = 0; l < layers; l++)
        lattice_layer(x, N, W, heads, F, w + W_LAYERS + l * L_COUNT, opts[F_LAYER_EPS], layer_scratch, bf16);
    rms_rows(x, N, W, w[W_FINAL_NORM], opts[F_LAYER_EPS], conf);  /* LatticeTransformer.norm (its layers' eps): h (N, W) */
    /* fused = SiLU(fuse(cat[h, t, h * t])); out | in = out_in(fused); unit-norm each */
    for (int n = 0; n < N; n++) {
        float *c = cat + (size_t)n * 3 * W;
        const float *hn = conf + (size_t)n * W;
        for (int j = 0; j < W; j++) { c[j] = hn[j]; c[W + j] = t[j]; c[2 * W + j] = hn[j] * t[j]; }
    }
    linear(cat, N, 3 * W, w[W_FUSE_T], w[W_FUSE_B], W, x, bf16);
    silu_inplace(x, N * W);
    linear(x, N, W, w[W_OUTIN_T], w[W_OUTIN_B], 2 * d, oi, bf16);  /* (N, 2d): out | in */
    unit_rows(oi, 2 * N, d, 1e-12f);  /* each half-row is one vector */
    unit_rows(oi, 2 * N, d, 1e-8f);
    linear(t, 1, W, w[W_ANCHOR_T], w[W_ANCHOR_B], d, anchor, bf16);
    unit_rows(anchor, 1, d, 1e-12f);
    unit_rows(anchor, 1, d, 1e-8f);
    /* the greedy walk (Eq. 8): the anchor's out vector picks slot 0's candidate, each pick the next slot's */
    const float *prev = anchor;
    for (int s = 0; s < S; s++) {
        for (int k = 0; k < K; k++) path_scores[k] = sigma * dot(prev, oi + (size_t)(s * K + k) * 2 * d + d, d);
        int c = argmax(path_scores, K);
        if (walk_scores) memcpy(walk_scores + (size_t)s * K, path_scores, (size_t)K * sizeof(float));
        tokens[s] = cand[s * K + c];
        prev = oi + (size_t)(s * K + c) * 2 * d;  /* its out vector */
    }
}
