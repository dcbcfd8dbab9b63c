/* torch's antialiased uint8 resize (bilinear, bicubic: F.interpolate(..., antialias=True) on a
 * uint8 tensor, as torchvision's Resize and RandomResizedCrop run it), computed for a window of
 * the output only, pixel for pixel.
 *
 * Why: torch's kernel has no offset, so a Resize(256) + CenterCrop(224) computed by torch
 * resizes every row and column before the crop too; it also copies its RGB input into an RGBA
 * buffer and its output back. Here only the window's outputs are computed, from only the input
 * pixels their filters reach, into the caller's array, planar (CHW) or interleaved. Each output pixel is torch's: the same int16 weights and precision (computed over the
 * whole output, as torch does: _compute_index_ranges_int16_weights in UpSampleKernel.cpp), the
 * horizontal pass first into a uint8 intermediate, then the vertical one, each rounded and
 * clamped as torch does. The technique (int16 weights, pairs of taps per _mm256_madd_epi16)
 * is Pillow-SIMD's, which torch's AVX2 kernel also follows; a plain C loop does the same sums
 * where AVX2 is not available. The passes run without the GIL.
 *
 * window(src, in_top, in_left, in_h, in_w, out_h, out_w, top, left, dst, filter, planar, simd, flip=False)
 *   -> None
 *   src: uint8 (rows, columns, 3 or 4) with contiguous pixels (any row stride): rows
 *   [in_top, in_top + rows) and columns [in_left, in_left + columns) of an in_h x in_w image
 *   (in_top, in_left may be negative). The output window starts at (top, left) of the image
 *   resized to out_h x out_w; dst: a writable C-contiguous uint8 buffer of (3, h, w) (planar)
 *   or (h, w, 3) bytes, whose shape gives the window's size. filter: 0 bilinear, 1 bicubic.
 *   flip: the window written mirrored left to right (a RandomHorizontalFlip's copy saved: the
 *   horizontal pass computes output column w - 1 - x at x, with that column's own taps).
 *   ValueError when src does not hold every input pixel the window reads.
 * span(in_size, out_size, start, count, filter) -> (lo, hi): the input pixels [lo, hi) that
 *   outputs [start, start + count) read along one axis.
 * simd() -> bool: whether window() runs its AVX2 kernels here (simd=False: the plain C loops).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_KERNEL 1
#define AVX2 __attribute__((target("avx2")))
#endif

enum { BILINEAR = 0, BICUBIC = 1 };

/* torch's aa_filter of HelperInterpLinear and HelperInterpCubic (a = -0.5, as Pillow's) */
static double filter_at(int filter, double x) {
    if (x < 0.0)
        x = -x;
    if (filter == BICUBIC) {
        const double a = -0.5;
        if (x < 1.0)
            return ((a + 2) * x - (a + 3)) * x * x + 1;
        if (x < 2.0)
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
        return 0.0;
    }
    return x < 1.0 ? 1.0 - x : 0.0;
}

typedef struct {
    int stride;     /* weights stored per output: torch's max_interp_size rounded up to 4, the rest 0 */
    int precision;  /* fixed-point bits of the weights */
    int *lo, *n;    /* per output of the window: first input pixel and number of taps */
    int16_t *w;     /* per output of the window: stride weights */
} axis_t;

static void axis_free(axis_t *a) {
    free(a->lo);
    free(a->n);
    free(a->w);
    a->lo = a->n = NULL;
    a->w = NULL;
}

/* Where one output pixel's taps start (*xmin) and their count, as torch's
 * _compute_indices_min_size_weights_aa computes them */
static int64_t bounds(int64_t in_size, double scale, double support, int ksize, int64_t i, int64_t *xmin) {
    double center = scale * (i + 0.5);
    int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5), size;
    if (lo < 0)
        lo = 0;
    size = (hi < in_size ? hi : in_size) - lo;
    if (size < 0)
        size = 0;
    if (size > ksize)
        size = ksize;
    *xmin = lo;
    return size;
}

/* One output pixel's taps and weights (torch's _compute_indices_min_size_weights_aa): returns
 * their count, raises *wt_max to the largest normalised weight */
static int64_t taps(int filter, int64_t in_size, double scale, double support, int ksize, int64_t i,
                    int64_t *xmin, double *wt, double *wt_max) {
    double center = scale * (i + 0.5), total = 0.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int64_t size = bounds(in_size, scale, support, ksize, i, xmin), lo = *xmin, j;
    for (j = 0; j < size; j++) {
        double w = filter_at(filter, (j + lo - center + 0.5) * invscale);
        wt[j] = w;
        total += w;
    }
    if (total != 0.0)
        for (j = 0; j < size; j++) {
            wt[j] /= total;
            if (*wt_max < wt[j])
                *wt_max = wt[j];
        }
    for (j = size; j < ksize; j++)
        wt[j] = 0.0;
    return size;
}

static void axis_shape(int filter, int64_t in_size, int64_t out_size, double *scale, double *support, int *ksize) {
    double interp = filter == BICUBIC ? 4.0 : 2.0;
    *scale = (double)in_size / (double)out_size;
    *support = *scale >= 1.0 ? (interp * 0.5) * *scale : interp * 0.5;
    *ksize = (int)ceil(*support) * 2 + 1;
}

/* torch's _compute_index_ranges_int16_weights for outputs [start, start + count) of out_size:
 * the precision comes from the largest weight of the whole output, so every output is visited */
static int axis_init(axis_t *a, int filter, int64_t in_size, int64_t out_size, int64_t start, int64_t count) {
    double scale, support, wt_max = 0.0, *wt, *keep;
    int64_t i, xmin, size;
    int ksize, precision;
    axis_shape(filter, in_size, out_size, &scale, &support, &ksize);
    a->stride = (ksize + 3) & ~3;
    a->lo = malloc(sizeof(int) * (size_t)(count ? count : 1));
    a->n = malloc(sizeof(int) * (size_t)(count ? count : 1));
    a->w = calloc((size_t)a->stride * (size_t)(count + 1), sizeof(int16_t));  /* + 1: axis_reverse's spare */
    wt = malloc(sizeof(double) * (size_t)ksize);
    keep = malloc(sizeof(double) * (size_t)ksize * (size_t)(count ? count : 1));
    if (!a->lo || !a->n || !a->w || !wt || !keep) {
        free(wt);
        free(keep);
        axis_free(a);
        return -1;
    }
    for (i = 0; i < out_size; i++) {
        size = taps(filter, in_size, scale, support, ksize, i, &xmin, wt, &wt_max);
        if (i >= start && i < start + count) {
            a->lo[i - start] = (int)xmin;
            a->n[i - start] = (int)size;
            memcpy(keep + (i - start) * ksize, wt, sizeof(double) * (size_t)ksize);
        }
    }
    for (precision = 0; precision < 22; ++precision) {
        int next = (int)(0.5 + wt_max * (1 << (precision + 1)));
        if (next >= (1 << 15))
            break;
    }
    a->precision = precision;
    for (i = 0; i < count * ksize; i++) {
        double v = keep[i] * (1 << precision);
        a->w[i / ksize * a->stride + i % ksize] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wt);
    free(keep);
    return 0;
}

static inline uint8_t clip8(int32_t v, int precision) {
    v >>= precision;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* --- the passes, plain C ---------------------------------------------------------------- */

/* out: count RGBX pixels of one row; in: the row's input column x0, pixels channels bytes apart */
static void horizontal_row(uint8_t *out, const uint8_t *in, int64_t x0, int channels, const axis_t *a, int count) {
    int x, j, c;
    for (x = 0; x < count; x++) {
        const int16_t *k = a->w + (size_t)x * a->stride;
        const uint8_t *p = in + (size_t)(a->lo[x] - x0) * channels;
        int32_t acc[3];
        for (c = 0; c < 3; c++)
            acc[c] = 1 << (a->precision - 1);
        for (j = 0; j < a->n[x]; j++)
            for (c = 0; c < 3; c++)
                acc[c] += p[j * channels + c] * k[j];
        for (c = 0; c < 3; c++)
            out[4 * x + c] = clip8(acc[c], a->precision);
        out[4 * x + 3] = 0;
    }
}

/* out: bytes [from, bytes) of output row y (RGBX pixels); rows: the intermediate's rows, first =
 * its row 0's index */
static void vertical_row(uint8_t *out, const uint8_t *rows, size_t row_bytes, int first, const axis_t *a, int y,
                         int from, int bytes) {
    const int16_t *k = a->w + (size_t)y * a->stride;
    const uint8_t *base = rows + (size_t)(a->lo[y] - first) * row_bytes;
    int b, j;
    for (b = from; b < bytes; b++) {
        int32_t acc = 1 << (a->precision - 1);
        for (j = 0; j < a->n[y]; j++)
            acc += base[(size_t)j * row_bytes + b] * k[j];
        out[b] = clip8(acc, a->precision);
    }
}

#ifdef HAVE_AVX2_KERNEL
/* --- the passes, AVX2 (same sums; integer arithmetic, so the order of the taps does not matter) */

/* pairs of taps (p0, p1) of each channel as int16, for _mm256_madd_epi16 with (w0, w1) */
AVX2 static inline __m256i pair_mask(int channels, int second) {
    int o = second ? 2 * channels : 0;   /* first pixel of the pair */
    int ch = channels;
    return _mm256_setr_epi8(
        (char)(o), -1, (char)(o + ch), -1, (char)(o + 1), -1, (char)(o + ch + 1), -1,
        (char)(o + 2), -1, (char)(o + ch + 2), -1, -1, -1, -1, -1,
        (char)(o), -1, (char)(o + ch), -1, (char)(o + 1), -1, (char)(o + ch + 1), -1,
        (char)(o + 2), -1, (char)(o + ch + 2), -1, -1, -1, -1, -1);
}

/* One output pixel of two rows (one per 128-bit lane), as int32 sums per channel: 4 taps per
 * step, the weights past the pixel's taps being 0 (axis_t.stride), so each step reads 16 bytes
 * from a tap's pixel: up to (lo + n + 3 - x0) * channels + 16 bytes from the row's start, which
 * the caller guarantees are readable */
AVX2 static inline __m256i h_sums(const uint8_t *p0, const uint8_t *p1, const int16_t *k, int n, int channels,
                                  __m256i m0, __m256i m1, __m256i initial) {
    __m256i sss = initial, sss2 = _mm256_setzero_si256();
    int j;
    for (j = 0; j < n; j += 4) {
        int32_t w01, w23;
        size_t at = (size_t)j * channels;
        __m256i src = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + at))),
                                              _mm_loadu_si128((const __m128i *)(p1 + at)), 1);
        memcpy(&w01, k + j, 4);
        memcpy(&w23, k + j + 2, 4);
        sss = _mm256_add_epi32(sss, _mm256_madd_epi16(_mm256_shuffle_epi8(src, m0), _mm256_set1_epi32(w01)));
        sss2 = _mm256_add_epi32(sss2, _mm256_madd_epi16(_mm256_shuffle_epi8(src, m1), _mm256_set1_epi32(w23)));
    }
    return _mm256_add_epi32(sss, sss2);
}

/* two rows at once, in0 and in1 at input column x0; four output pixels share one rounding,
 * packing and store */
AVX2 static void horizontal_rows2(uint8_t *out0, uint8_t *out1, const uint8_t *in0, const uint8_t *in1, int64_t x0,
                                  int channels, const axis_t *a, int count) {
    const __m256i m0 = pair_mask(channels, 0), m1 = pair_mask(channels, 1);
    const __m256i initial = _mm256_set1_epi32(1 << (a->precision - 1)), zero = _mm256_setzero_si256();
    int x = 0;
#define SUMS(i) h_sums(in0 + (size_t)(a->lo[i] - x0) * channels, in1 + (size_t)(a->lo[i] - x0) * channels, \
                       a->w + (size_t)(i) * a->stride, a->n[i], channels, m0, m1, initial)
    for (; x + 4 <= count; x += 4) {
        __m256i s0 = _mm256_srai_epi32(SUMS(x), a->precision), s1 = _mm256_srai_epi32(SUMS(x + 1), a->precision);
        __m256i s2 = _mm256_srai_epi32(SUMS(x + 2), a->precision), s3 = _mm256_srai_epi32(SUMS(x + 3), a->precision);
        __m256i v = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
        _mm_storeu_si128((__m128i *)(out0 + 4 * (size_t)x), _mm256_castsi256_si128(v));
        _mm_storeu_si128((__m128i *)(out1 + 4 * (size_t)x), _mm256_extracti128_si256(v, 1));
    }
    for (; x < count; x++) {
        __m256i v = _mm256_srai_epi32(SUMS(x), a->precision);
        int32_t v0, v1;
        v = _mm256_packus_epi16(_mm256_packs_epi32(v, zero), zero);
        v0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(v));
        v1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(v, 1));
        memcpy(out0 + 4 * (size_t)x, &v0, 4);
        memcpy(out1 + 4 * (size_t)x, &v1, 4);
    }
#undef SUMS
}

/* one output row, 8 RGBX pixels (32 bytes) at a time, two taps per step (the weight past the
 * last tap is 0, its row one that run() allocates); the rest in plain C */
AVX2 static void vertical_row_avx2(uint8_t *out, const uint8_t *rows, size_t row_bytes, int first, const axis_t *a,
                                   int y, int width) {
    const int16_t *k = a->w + (size_t)y * a->stride;
    const uint8_t *base = rows + (size_t)(a->lo[y] - first) * row_bytes;
    const __m256i initial = _mm256_set1_epi32(1 << (a->precision - 1)), zero = _mm256_setzero_si256();
    int n = a->n[y], b = 0, bytes = width * 4;
    for (; b + 32 <= bytes; b += 32) {
        __m256i s0 = initial, s1 = initial, s2 = initial, s3 = initial;
        int j;
        for (j = 0; j < n; j += 2) {
            int32_t w01;
            __m256i r0 = _mm256_loadu_si256((const __m256i *)(base + (size_t)j * row_bytes + b));
            __m256i r1 = _mm256_loadu_si256((const __m256i *)(base + (size_t)(j + 1) * row_bytes + b));
            __m256i lo = _mm256_unpacklo_epi8(r0, r1), hi = _mm256_unpackhi_epi8(r0, r1), mmk;
            memcpy(&w01, k + j, 4);
            mmk = _mm256_set1_epi32(w01);
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), mmk));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), mmk));
            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), mmk));
            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), mmk));
        }
        s0 = _mm256_srai_epi32(s0, a->precision);
        s1 = _mm256_srai_epi32(s1, a->precision);
        s2 = _mm256_srai_epi32(s2, a->precision);
        s3 = _mm256_srai_epi32(s3, a->precision);
        _mm256_storeu_si256((__m256i *)(out + b),
                            _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3)));
    }
    vertical_row(out, rows, row_bytes, first, a, y, b, bytes);
}

/* RGBX pixels to three planes, 8 at a time; returns how many were done */
AVX2 static int split_avx2(uint8_t *r, uint8_t *g, uint8_t *bl, const uint8_t *in, int width) {
    const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int x = 0;
    for (; x + 8 <= width; x += 8) {
        /* per lane RRRR GGGG BBBB XXXX, then the lanes' R, G, B side by side */
        __m256i v = _mm256_loadu_si256((const __m256i *)(in + 4 * (size_t)x));
        __m128i lo, hi;
        v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, planes), order);
        lo = _mm256_castsi256_si128(v);
        hi = _mm256_extracti128_si256(v, 1);
        _mm_storel_epi64((__m128i *)(r + x), lo);
        _mm_storel_epi64((__m128i *)(g + x), _mm_unpackhi_epi64(lo, lo));
        _mm_storel_epi64((__m128i *)(bl + x), hi);
    }
    return x;
}

static int has_avx2(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return known;
}
#endif

/* --- the window ------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *src;
    Py_ssize_t row_stride, src_end;  /* src_end: readable bytes from src */
    int channels;
    int64_t in_top, in_left, in_h, in_w, out_h, out_w, top, left, h, w;
    int filter, planar, simd, flip;
    uint8_t *dst;
} job_t;

/* RGBX pixels of one output row to dst's row y */
static void store_row(const job_t *job, const uint8_t *line, int64_t y) {
    int64_t w = job->w, x = 0;
    if (job->planar) {
        size_t plane = (size_t)job->h * (size_t)w;
        uint8_t *r = job->dst + (size_t)y * w, *g = r + plane, *b = g + plane;
#ifdef HAVE_AVX2_KERNEL
        if (job->simd)
            x = split_avx2(r, g, b, line, (int)w);
#endif
        for (; x < w; x++) {
            r[x] = line[4 * x];
            g[x] = line[4 * x + 1];
            b[x] = line[4 * x + 2];
        }
    } else {
        uint8_t *out = job->dst + (size_t)y * w * 3;
        for (; x < w; x++)
            memcpy(out + 3 * x, line + 4 * x, 3);
    }
}

static const uint8_t *src_row(const job_t *job, int64_t row) {
    return job->src + (size_t)(row - job->in_top) * (size_t)job->row_stride;
}

/* The horizontal pass (or, when the width does not change, a copy of the window's columns) of
 * input rows [y0, y1) into RGBX rows of job->w pixels */
static void horizontal(const job_t *job, const axis_t *ax, int64_t y0, int64_t y1, uint8_t *mid) {
    size_t mid_row = (size_t)job->w * 4;
    int64_t y = y0;
    int channels = job->channels;
    if (job->in_w == job->out_w) {
        for (; y < y1; y++) {
            const uint8_t *in = src_row(job, y) + (size_t)(job->left - job->in_left) * channels;
            uint8_t *out = mid + (size_t)(y - y0) * mid_row;
            int64_t x;
            for (x = 0; x < job->w; x++) {
                memcpy(out + 4 * x, in + (job->flip ? job->w - 1 - x : x) * channels, 3);
                out[4 * x + 3] = 0;
            }
        }
        return;
    }
#ifdef HAVE_AVX2_KERNEL
    if (job->simd) {
        /* loads reach (lo + n + 3) * channels + 16 bytes into a row (h_sums): a row pair whose
         * loads could pass src's end is first copied into a padded buffer */
        int64_t first = ax->lo[0], last = 0, i;
        size_t pad_row;
        uint8_t *pad = NULL;
        for (i = 0; i < job->w; i++) {
            first = ax->lo[i] < first ? ax->lo[i] : first;
            last = ax->lo[i] + ax->n[i] > last ? ax->lo[i] + ax->n[i] : last;
        }
        pad_row = (size_t)(last - first + 4) * channels + 16;
        for (; y < y1; y += 2) {
            /* rows y and y + 1; a last odd row is paired with itself, the copy discarded */
            int64_t y_next = y + 1 < y1 ? y + 1 : y;
            const uint8_t *in0 = src_row(job, y), *in1 = src_row(job, y_next);  /* at column in_left */
            int64_t x0 = job->in_left;
            int64_t reads_to = (y_next - job->in_top) * job->row_stride + (last + 3 - job->in_left) * channels + 16;
            uint8_t *out1 = mid + (size_t)(y_next - y0) * mid_row;
            if (reads_to > job->src_end || y_next == y) {
                if (pad == NULL && (pad = calloc(2 * pad_row + mid_row, 1)) == NULL)
                    break;  /* plain C below */
                memcpy(pad, in0 + (size_t)(first - x0) * channels, (size_t)(last - first) * channels);
                memcpy(pad + pad_row, in1 + (size_t)(first - x0) * channels, (size_t)(last - first) * channels);
                in0 = pad;
                in1 = pad + pad_row;
                x0 = first;
                if (y_next == y)
                    out1 = pad + 2 * pad_row;
            }
            horizontal_rows2(mid + (size_t)(y - y0) * mid_row, out1, in0, in1, x0, channels, ax, (int)job->w);
        }
        free(pad);
    }
#endif
    for (; y < y1; y++)
        horizontal_row(mid + (size_t)(y - y0) * mid_row, src_row(job, y), job->in_left, channels, ax, (int)job->w);
}

/* The axis's outputs in reverse order: output x then takes output count - 1 - x's taps and
 * weights, so the pass writes the mirrored row with the same sums */
static void axis_reverse(axis_t *a, int64_t count) {
    int64_t i, j;
    int16_t *tmp = a->w + (size_t)count * a->stride;  /* axis_init allocates one spare row */
    for (i = 0, j = count - 1; i < j; i++, j--) {
        int t = a->lo[i];
        a->lo[i] = a->lo[j];
        a->lo[j] = t;
        t = a->n[i];
        a->n[i] = a->n[j];
        a->n[j] = t;
        memcpy(tmp, a->w + (size_t)i * a->stride, sizeof(int16_t) * (size_t)a->stride);
        memcpy(a->w + (size_t)i * a->stride, a->w + (size_t)j * a->stride, sizeof(int16_t) * (size_t)a->stride);
        memcpy(a->w + (size_t)j * a->stride, tmp, sizeof(int16_t) * (size_t)a->stride);
    }
}

/* 0, or -1 when memory runs out */
static int run(const job_t *job) {
    axis_t ax = {0}, ay = {0};
    int64_t y0, y1, y;
    uint8_t *mid = NULL, *line = NULL;
    size_t mid_row = (size_t)job->w * 4;
    int vertical = job->in_h != job->out_h, status = -1;
    if (axis_init(&ax, job->filter, job->in_w, job->out_w, job->left, job->w) < 0)
        return -1;
    if (job->flip)
        axis_reverse(&ax, job->w);
    if (axis_init(&ay, job->filter, job->in_h, job->out_h, job->top, job->h) < 0)
        goto done;
    if (vertical) {
        y0 = ay.lo[0];
        y1 = y0;
        for (y = 0; y < job->h; y++) {
            y0 = ay.lo[y] < y0 ? ay.lo[y] : y0;
            y1 = ay.lo[y] + ay.n[y] > y1 ? ay.lo[y] + ay.n[y] : y1;
        }
    } else {
        y0 = job->top;
        y1 = job->top + job->h;
    }
    /* one more row, zeroed: the vertical pass reads a row past its last tap, at weight 0 */
    mid = malloc(mid_row * (size_t)(y1 - y0 + 1));
    line = malloc(mid_row + 32);
    if (!mid || !line)
        goto done;
    memset(mid + mid_row * (size_t)(y1 - y0), 0, mid_row);
    horizontal(job, &ax, y0, y1, mid);
    for (y = 0; y < job->h; y++) {
        if (!vertical) {  /* the height is unchanged: the intermediate's rows are the output's */
            store_row(job, mid + (size_t)y * mid_row, y);
            continue;
        }
#ifdef HAVE_AVX2_KERNEL
        if (job->simd)
            vertical_row_avx2(line, mid, mid_row, (int)y0, &ay, (int)y, (int)job->w);
        else
#endif
            vertical_row(line, mid, mid_row, (int)y0, &ay, (int)y, 0, (int)job->w * 4);
        store_row(job, line, y);
    }
    status = 0;
done:
    free(mid);
    free(line);
    axis_free(&ax);
    axis_free(&ay);
    return status;
}

/* [lo, hi) of the input read by outputs [start, start + count) */
static void reach(int filter, int64_t in_size, int64_t out_size, int64_t start, int64_t count, int64_t *lo,
                  int64_t *hi) {
    double scale, support;
    int ksize;
    int64_t i, xmin, size;
    axis_shape(filter, in_size, out_size, &scale, &support, &ksize);
    *lo = in_size;
    *hi = 0;
    for (i = start; i < start + count; i++) {
        size = bounds(in_size, scale, support, ksize, i, &xmin);
        if (size > 0) {
            *lo = xmin < *lo ? xmin : *lo;
            *hi = xmin + size > *hi ? xmin + size : *hi;
        }
    }
    if (*hi <= *lo)
        *lo = *hi = 0;
}

#define SIDE_LIMIT (1 << 24)  /* sides and offsets: far beyond any image, and no sum overflows */

static int sizes_ok(int64_t in_size, int64_t out_size, int64_t start, int64_t count) {
    return in_size > 0 && out_size > 0 && in_size < SIDE_LIMIT && out_size < SIDE_LIMIT && count > 0
           && count <= out_size && start >= 0 && start <= out_size - count;
}

static PyObject *span(PyObject *self, PyObject *args) {
    long long in_size, out_size, start, count;
    int filter;
    int64_t lo, hi;
    (void)self;
    if (!PyArg_ParseTuple(args, "LLLLi", &in_size, &out_size, &start, &count, &filter))
        return NULL;
    if (!sizes_ok(in_size, out_size, start, count) || (filter != BILINEAR && filter != BICUBIC)) {
        PyErr_SetString(PyExc_ValueError, "span: bad sizes or filter");
        return NULL;
    }
    reach(filter, in_size, out_size, start, count, &lo, &hi);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

/* a buffer format of unsigned bytes (struct's "B", with or without a byte order) */
static int unsigned_bytes(const char *format) {
    if (format == NULL)
        return 1;
    if (*format == '<' || *format == '>' || *format == '=' || *format == '!' || *format == '@' || *format == '|')
        format++;
    return strcmp(format, "B") == 0;
}

static PyObject *window(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    Py_buffer src, dst;
    long long in_top, in_left, in_h, in_w, out_h, out_w, top, left;
    int filter, planar, simd, flip = 0, status;
    job_t job;
    int64_t lo, hi, lo_x, hi_x;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLLLLLLLLOipp|p", &src_obj, &in_top, &in_left, &in_h, &in_w, &out_h, &out_w, &top,
                          &left, &dst_obj, &filter, &planar, &simd, &flip))
        return NULL;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    memset(&job, 0, sizeof(job));
    if (src.ndim != 3 || src.itemsize != 1 || !unsigned_bytes(src.format)
        || (src.shape[2] != 3 && src.shape[2] != 4) || src.strides[2] != 1 || src.strides[1] != src.shape[2]
        || src.strides[0] < src.shape[1] * src.shape[2] || src.shape[0] < 1 || src.shape[1] < 1) {
        PyErr_SetString(PyExc_ValueError, "window: src must be uint8 (rows, columns, 3 or 4) with contiguous pixels");
        goto fail;
    }
    if (dst.ndim != 3 || dst.itemsize != 1 || !unsigned_bytes(dst.format)
        || dst.shape[planar ? 0 : 2] != 3) {
        PyErr_SetString(PyExc_ValueError, "window: dst must be uint8, (3, h, w) if planar else (h, w, 3)");
        goto fail;
    }
    job.h = planar ? dst.shape[1] : dst.shape[0];
    job.w = planar ? dst.shape[2] : dst.shape[1];
    if ((filter != BILINEAR && filter != BICUBIC) || !sizes_ok(in_h, out_h, top, job.h)
        || !sizes_ok(in_w, out_w, left, job.w) || in_top <= -SIDE_LIMIT || in_top >= SIDE_LIMIT
        || in_left <= -SIDE_LIMIT || in_left >= SIDE_LIMIT || src.shape[0] >= SIDE_LIMIT
        || src.shape[1] >= SIDE_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "window: bad sizes, window, origin or filter");
        goto fail;
    }
    /* every input pixel the window reads must be in src */
    if (in_h != out_h)
        reach(filter, in_h, out_h, top, job.h, &lo, &hi);
    else
        lo = top, hi = top + job.h;
    if (in_w != out_w)
        reach(filter, in_w, out_w, left, job.w, &lo_x, &hi_x);
    else
        lo_x = left, hi_x = left + job.w;
    if (lo < in_top || hi > in_top + src.shape[0] || lo_x < in_left || hi_x > in_left + src.shape[1]) {
        PyErr_Format(PyExc_ValueError,
                     "window: src holds rows [%lld, %lld) and columns [%lld, %lld), the window reads [%lld, %lld) "
                     "and [%lld, %lld)", in_top, in_top + (long long)src.shape[0], in_left,
                     in_left + (long long)src.shape[1], (long long)lo, (long long)hi, (long long)lo_x, (long long)hi_x);
        goto fail;
    }
    job.src = src.buf;
    job.row_stride = src.strides[0];
    job.src_end = (src.shape[0] - 1) * src.strides[0] + src.shape[1] * src.shape[2];
    job.channels = (int)src.shape[2];
    job.in_top = in_top, job.in_left = in_left, job.in_h = in_h, job.in_w = in_w;
    job.out_h = out_h, job.out_w = out_w, job.top = top, job.left = left;
    job.filter = filter, job.planar = planar, job.flip = flip;
#ifdef HAVE_AVX2_KERNEL
    job.simd = simd && has_avx2();
#else
    job.simd = 0;
#endif
    job.dst = dst.buf;
    Py_BEGIN_ALLOW_THREADS
    status = run(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return NULL;
}

static PyObject *simd(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
#ifdef HAVE_AVX2_KERNEL
    return PyBool_FromLong(has_avx2());
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_NOARGS, "simd() -> bool: whether window() runs its AVX2 kernels on this CPU"},
    {"window", window, METH_VARARGS,
     "window(src, in_top, in_left, in_h, in_w, out_h, out_w, top, left, dst, filter, planar, simd, flip=False) -> None"},
    {"span", span, METH_VARARGS, "span(in_size, out_size, start, count, filter) -> (lo, hi)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resize", NULL, -1, methods};

PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&module); }
