/* Decode only a region of a JPEG: libjpeg-turbo's jpeg_crop_scanline (columns) and
 * jpeg_skip_scanlines (rows above), stopping after the region's last row.
 *
 * Rows above the region and columns beside it are still entropy-decoded (a JPEG scan has no
 * entry point in its middle) but skip the inverse DCT, upsampling and colour conversion, which
 * are most of a decode; rows below it are not read at all. Strict: every libjpeg warning
 * (corrupt or premature data) is an error, as TurboJPEG's TJFLAG_STOPONWARNING makes it, so
 * the caller can hand such a file to Pillow. The decode runs without the GIL.
 *
 * region(data, plan) -> (pixels: bytearray, rows, columns, top, left) | None
 *   plan(height, width) -> (k, top, bottom, left, right) | None: called with the frame's size
 *   once the header is read; k the DCT reduction (1, 2, 4, 8), the region in full-resolution
 *   pixels. The result covers it, from top / k and from left / k moved left to a block
 *   boundary (or from 0, where cropping columns would not be exact: see crop_is_exact).
 *   None when the file is not one this decodes (progressive or multi-scan, CMYK, an empty
 *   frame) or when plan returns None.
 *   A file with restart markers at an interval that divides its MCU rows (restart(), below,
 *   writes one every MCU) is not entropy-decoded outside the region either: the segments the
 *   region needs (each restart resets the DC predictors) are copied into a smaller JPEG, the
 *   same header with the frame's size cut and the markers renumbered, which decodes to the same
 *   pixels wherever the region's edge (REGION_EDGE in codecs/jpeg.py: one chroma sample of
 *   upsampling context) lies inside it. Its segments are counted and its markers checked in
 *   sequence up to EOI first; a file where they are not decodes as one without them. Raises ValueError with libjpeg's message on what
 *   libjpeg refuses or warns about, and on data after the region's last row that does not end
 *   in the EOI marker (a truncated file); plan's exceptions propagate.
 *
 * restart(data) -> bytes | None
 *   The same JPEG losslessly rewritten with a restart marker after every MCU: the DCT
 *   coefficients are copied (jpeg_read_coefficients -> jpeg_write_coefficients, Huffman tables
 *   optimised, APPn and COM markers kept), so every decode gives the same pixels. None for what
 *   region() would not take that way (progressive, arithmetic-coded, CMYK, several scans) or a
 *   file that has them already; ValueError on what libjpeg refuses or warns about.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} strict_error;

static void fail(j_common_ptr cinfo) {
    strict_error *err = (strict_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0)  /* a warning: corrupt or premature data */
        fail(cinfo);
}

static void silent(j_common_ptr cinfo) { (void)cinfo; }

/* Whether the first marker after the decoder's position is EOI: what libjpeg itself would find
 * after the last row (restart markers and fill bytes between are part of the scan). */
static int ends_in_eoi(j_decompress_ptr cinfo) {
    const JOCTET *p = cinfo->src->next_input_byte;
    const JOCTET *end = p + cinfo->src->bytes_in_buffer;
    int marker = cinfo->unread_marker;
    if (marker && !(marker >= 0xD0 && marker <= 0xD7))
        return marker == 0xD9;
    while (p < end) {
        p = memchr(p, 0xFF, (size_t)(end - p));
        if (p == NULL)
            return 0;
        while (p < end && *p == 0xFF)
            p++;
        if (p == end)
            return 0;
        marker = *p++;
        if (marker == 0 || (marker >= 0xD0 && marker <= 0xD7))
            continue;
        return marker == 0xD9;
    }
    return 0;
}

#if JPEG_LIB_VERSION >= 70
#define SCALED_H(c) ((c)->DCT_h_scaled_size)
#define SCALED_V(c) ((c)->DCT_v_scaled_size)
#define MIN_SCALED_H(d) ((d)->min_DCT_h_scaled_size)
#define MIN_SCALED_V(d) ((d)->min_DCT_v_scaled_size)
#else
#define SCALED_H(c) ((c)->DCT_scaled_size)
#define SCALED_V(c) ((c)->DCT_scaled_size)
#define MIN_SCALED_H(d) ((d)->min_DCT_scaled_size)
#define MIN_SCALED_V(d) ((d)->min_DCT_scaled_size)
#endif

/* Whether jpeg_crop_scanline gives the whole decode's pixels: libjpeg-turbo before 3.0.0
 * miscomputes the width of a component that DCT scaling enlarged but that still needs
 * upsampling (4x2 and 2x4 sampling at 1/2 and 1/4), and upsamples uninitialised memory. Such a
 * file is decoded at its full width instead (rows are still skipped). */
static int crop_is_exact(j_decompress_ptr cinfo) {
    int ci;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        jpeg_component_info *c = &cinfo->comp_info[ci];
        int h = SCALED_H(c), v = SCALED_V(c), min_h = MIN_SCALED_H(cinfo), min_v = MIN_SCALED_V(cinfo);
        int upsampled = cinfo->max_h_samp_factor * min_h != c->h_samp_factor * h
                        || cinfo->max_v_samp_factor * min_v != c->v_samp_factor * v;
        if ((h != min_h || v != min_v) && upsampled)
            return 0;
    }
    return 1;
}

/* Where the frame header (SOFn) and the entropy-coded data of the first scan start: 0 when the
 * markers up to SOS are not well formed. */
static int find_layout(const JOCTET *d, size_t n, size_t *sof, size_t *scan) {
    size_t p = 2;
    *sof = 0;
    while (p + 4 <= n) {
        int m;
        size_t len;
        if (d[p] != 0xFF)
            return 0;
        if (d[p + 1] == 0xFF) {  /* fill byte */
            p++;
            continue;
        }
        m = d[p + 1];
        if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
            p += 2;
            continue;
        }
        len = ((size_t)d[p + 2] << 8) | d[p + 3];
        if (len < 2)
            return 0;
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)
            *sof = p;
        if (m == 0xDA) {
            *scan = p + 2 + len;
            return *sof != 0 && *scan <= n;
        }
        p += 2 + len;
    }
    return 0;
}

/* The restart segments of the scan from `scan`: starts[i] and ends[i] (exclusive, before any
 * fill bytes and the marker) for each of the `count` segments, the last one ended by EOI, the
 * markers RST0..7 in sequence. 0 when the data is not exactly that (a missing, extra or
 * misnumbered marker, another marker, no EOI: a damaged or truncated file). */
static int find_segments(const JOCTET *d, size_t n, size_t scan, size_t count, size_t *starts, size_t *ends) {
    const JOCTET *p = d + scan, *end = d + n;
    size_t i = 0;
    starts[0] = scan;
    while (p < end) {
        const JOCTET *q = memchr(p, 0xFF, (size_t)(end - p));
        const JOCTET *r;
        int m;
        if (q == NULL)
            return 0;
        r = q + 1;
        while (r < end && *r == 0xFF)
            r++;
        if (r == end)
            return 0;
        m = *r;
        if (m == 0) {
            p = r + 1;
            continue;
        }
        ends[i] = (size_t)(q - d);
        if (m == 0xD9)
            return i + 1 == count;
        if (m != 0xD0 + (int)(i & 7) || ++i >= count)
            return 0;
        starts[i] = (size_t)(r + 1 - d);
        p = r + 1;
    }
    return 0;
}

/* The smaller JPEG of MCU rows [r0, r1) and restart segments [s0, s1) of each row: the header
 * with the frame's size set, those segments with their markers renumbered, EOI. NULL when
 * memory runs out. */
static JOCTET *sub_jpeg(const JOCTET *d, size_t sof, size_t scan, const size_t *starts, const size_t *ends,
                        size_t per_row, size_t r0, size_t r1, size_t s0, size_t s1,
                        unsigned height, unsigned width, size_t *length) {
    size_t total = scan + 2, r, s, at, j = 0;
    JOCTET *out;
    for (r = r0; r < r1; r++)
        for (s = s0; s < s1; s++)
            total += ends[r * per_row + s] - starts[r * per_row + s] + 2;
    out = malloc(total);
    if (out == NULL)
        return NULL;
    memcpy(out, d, scan);
    out[sof + 5] = (JOCTET)(height >> 8);
    out[sof + 6] = (JOCTET)(height & 0xFF);
    out[sof + 7] = (JOCTET)(width >> 8);
    out[sof + 8] = (JOCTET)(width & 0xFF);
    at = scan;
    for (r = r0; r < r1; r++)
        for (s = s0; s < s1; s++) {
            size_t i = r * per_row + s;
            if (j) {
                out[at++] = 0xFF;
                out[at++] = (JOCTET)(0xD0 + ((j - 1) & 7));
            }
            memcpy(out + at, d + starts[i], ends[i] - starts[i]);
            at += ends[i] - starts[i];
            j++;
        }
    out[at++] = 0xFF;
    out[at++] = 0xD9;
    *length = at;
    return out;
}

static PyObject *region(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *plan;
    PyObject *volatile planned = NULL;
    PyObject *volatile pixels = NULL;
    char *base;
    PyThreadState *volatile unlocked = NULL;
    struct jpeg_decompress_struct cinfo;
    strict_error err;
    int k = 1, top = 0, bottom = 0, left = 0, right = 0;
    JDIMENSION x, width, y0, y1, row;
    JOCTET *volatile sub = NULL;
    size_t *volatile starts = NULL;
    unsigned oy = 0, ox = 0;  /* where the smaller JPEG starts in the image, full resolution */
    (void)self;

    if (!PyArg_ParseTuple(args, "y*O", &view, &plan))
        return NULL;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = fail;
    err.pub.emit_message = on_message;
    err.pub.output_message = silent;
    err.message[0] = 0;
    if (setjmp(err.jump)) {
        if (unlocked != NULL)
            PyEval_RestoreThread(unlocked);
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&view);
        Py_XDECREF((PyObject *)pixels);
        Py_XDECREF((PyObject *)planned);
        free(sub);
        free(starts);
        PyErr_Format(PyExc_ValueError, "libjpeg: %s", err.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)view.buf, (unsigned long)view.len);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.progressive_mode || cinfo.comps_in_scan != cinfo.num_components
        || cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK
        || cinfo.image_width == 0 || cinfo.image_height == 0)
        goto decline;  /* several passes (all of it is read up front), or not RGB out */
    planned = PyObject_CallFunction(plan, "II", cinfo.image_height, cinfo.image_width);
    if (planned == NULL)
        goto error;
    if (planned == Py_None)
        goto decline;
    if (!PyTuple_Check((PyObject *)planned)) {
        PyErr_SetString(PyExc_TypeError, "region: plan must return a tuple (k, top, bottom, left, right) or None");
        goto error;
    }
    if (!PyArg_ParseTuple((PyObject *)planned, "iiiii", &k, &top, &bottom, &left, &right))
        goto error;
    if ((k != 1 && k != 2 && k != 4 && k != 8) || top < 0 || left < 0 || bottom <= top || right <= left) {
        PyErr_Format(PyExc_ValueError, "region: bad plan (%d, %d, %d, %d, %d)", k, top, bottom, left, right);
        goto error;
    }
    if (cinfo.restart_interval > 0 && !cinfo.arith_code) {
        /* the segments the region needs, where the restart interval divides the MCU rows */
        unsigned W = cinfo.image_width, H = cinfo.image_height;
        unsigned mw = cinfo.num_components == 1 ? 8 : 8 * (unsigned)cinfo.max_h_samp_factor;
        unsigned mh = cinfo.num_components == 1 ? 8 : 8 * (unsigned)cinfo.max_v_samp_factor;
        size_t cols = (W + mw - 1) / mw, rows = (H + mh - 1) / mh, interval = cinfo.restart_interval;
        size_t per_row = cols / interval, sof, scan, r0, r1, s0, s1, length;
        unsigned seg_w = mw * (unsigned)interval;
        unsigned b = (unsigned)bottom < H ? (unsigned)bottom : H, r = (unsigned)right < W ? (unsigned)right : W;
        if (cols % interval == 0 && (unsigned)top < H && (unsigned)left < W) {
            r0 = (unsigned)top / mh;
            r1 = (b + mh - 1) / mh;
            s0 = (unsigned)left / seg_w;
            s1 = (r + seg_w - 1) / seg_w;
            if ((r0 > 0 || s0 > 0 || s1 < per_row)
                && find_layout((const JOCTET *)view.buf, (size_t)view.len, &sof, &scan)
                && (starts = malloc(2 * rows * per_row * sizeof(size_t))) != NULL
                && find_segments((const JOCTET *)view.buf, (size_t)view.len, scan, rows * per_row, starts,
                                 starts + rows * per_row)) {
                unsigned sub_h = (r1 * mh < H ? (unsigned)r1 * mh : H) - (unsigned)r0 * mh;
                unsigned sub_w = (s1 * seg_w < W ? (unsigned)s1 * seg_w : W) - (unsigned)s0 * seg_w;
                sub = sub_jpeg((const JOCTET *)view.buf, sof, scan, starts, starts + rows * per_row, per_row,
                               r0, r1, s0, s1, sub_h, sub_w, &length);
                if (sub != NULL) {
                    oy = (unsigned)r0 * mh;
                    ox = (unsigned)s0 * seg_w;
                    jpeg_abort_decompress(&cinfo);
                    jpeg_mem_src(&cinfo, sub, (unsigned long)length);
                    jpeg_read_header(&cinfo, TRUE);
                    top -= (int)oy;
                    bottom -= (int)oy;
                    left -= (int)ox;
                    right -= (int)ox;
                }
            }
            free(starts);
            starts = NULL;
        }
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)k;
    jpeg_start_decompress(&cinfo);
    /* the region at 1/k, clamped to the output: pixel i at 1/k covers [k i, k (i + 1)) */
    y0 = (JDIMENSION)(top / k);
    y1 = (JDIMENSION)(((long long)bottom + k - 1) / k);
    x = (JDIMENSION)(left / k);
    if (y1 > cinfo.output_height)
        y1 = cinfo.output_height;
    width = (JDIMENSION)(((long long)right + k - 1) / k);
    if (width > cinfo.output_width)
        width = cinfo.output_width;
    if (y0 >= y1 || x >= width)
        goto decline;
    width -= x;
    if (!crop_is_exact(&cinfo)) {
        x = 0;
        width = cinfo.output_width;
    } else if (x > 0 || width < cinfo.output_width) {
        jpeg_crop_scanline(&cinfo, &x, &width);  /* x moves left to a block boundary */
    }
    pixels = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(y1 - y0) * width * 3);
    if (pixels == NULL)
        goto error;
    base = PyByteArray_AS_STRING((PyObject *)pixels);
    unlocked = PyEval_SaveThread();
    if (y0 > 0 && jpeg_skip_scanlines(&cinfo, y0) != y0) {
        strcpy(err.message, "could not skip to the region");
        longjmp(err.jump, 1);
    }
    for (row = y0; row < y1;) {
        JSAMPROW at = (JSAMPROW)(base + (size_t)(row - y0) * width * 3);
        if (jpeg_read_scanlines(&cinfo, &at, 1) != 1) {
            strcpy(err.message, "no scanline returned");
            longjmp(err.jump, 1);
        }
        row++;
    }
    if (y1 == cinfo.output_height) {
        jpeg_finish_decompress(&cinfo);  /* reads on to EOI, warning on anything after the scan */
    } else if (!ends_in_eoi(&cinfo)) {
        strcpy(err.message, "the data after the region does not end in EOI (truncated?)");
        longjmp(err.jump, 1);
    }
    PyEval_RestoreThread(unlocked);
    unlocked = NULL;
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    Py_DECREF((PyObject *)planned);
    free(sub);
    return Py_BuildValue("(NIIII)", (PyObject *)pixels, y1 - y0, width, y0 + oy / (unsigned)k, x + ox / (unsigned)k);

decline:
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    Py_XDECREF((PyObject *)planned);
    free(sub);
    Py_RETURN_NONE;
error:
    jpeg_destroy_decompress(&cinfo);
    free(sub);
    PyBuffer_Release(&view);
    Py_XDECREF((PyObject *)planned);
    Py_XDECREF((PyObject *)pixels);
    return NULL;
}

static PyObject *restart(PyObject *self, PyObject *args) {
    Py_buffer view;
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    strict_error err;
    jvirt_barray_ptr *coefficients;
    jpeg_saved_marker_ptr marker;
    unsigned char *volatile out = NULL;
    unsigned long size = 0;
    volatile int compressing = 0;
    PyThreadState *volatile unlocked = NULL;
    PyObject *result;
    int m;
    (void)self;

    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    src.err = jpeg_std_error(&err.pub);
    dst.err = &err.pub;
    err.pub.error_exit = fail;
    err.pub.emit_message = on_message;
    err.pub.output_message = silent;
    err.message[0] = 0;
    if (setjmp(err.jump)) {
        if (unlocked != NULL)
            PyEval_RestoreThread(unlocked);
        if (compressing)
            jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(out);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "libjpeg: %s", err.message);
        return NULL;
    }
    jpeg_create_decompress(&src);
    jpeg_mem_src(&src, (const unsigned char *)view.buf, (unsigned long)view.len);
    jpeg_save_markers(&src, JPEG_COM, 0xFFFF);
    for (m = 0; m < 16; m++)
        jpeg_save_markers(&src, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    if (src.progressive_mode || src.arith_code || src.comps_in_scan != src.num_components
        || src.jpeg_color_space == JCS_CMYK || src.jpeg_color_space == JCS_YCCK
        || src.image_width == 0 || src.image_height == 0 || src.restart_interval == 1) {
        jpeg_destroy_decompress(&src);
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    unlocked = PyEval_SaveThread();
    coefficients = jpeg_read_coefficients(&src);
    jpeg_create_compress(&dst);
    compressing = 1;
    jpeg_mem_dest(&dst, (unsigned char **)&out, &size);
    jpeg_copy_critical_parameters(&src, &dst);
    dst.restart_interval = 1;
    dst.optimize_coding = TRUE;
    jpeg_write_coefficients(&dst, coefficients);
    for (marker = src.marker_list; marker != NULL; marker = marker->next) {
        /* the JFIF and Adobe markers libjpeg writes itself (as jpegtran's -copy all) */
        if (dst.write_JFIF_header && marker->marker == JPEG_APP0 && marker->data_length >= 5
            && memcmp(marker->data, "JFIF", 5) == 0)
            continue;
        if (dst.write_Adobe_marker && marker->marker == JPEG_APP0 + 14 && marker->data_length >= 5
            && memcmp(marker->data, "Adobe", 5) == 0)
            continue;
        jpeg_write_marker(&dst, marker->marker, marker->data, marker->data_length);
    }
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);  /* reads on to EOI, warning on anything after the scan */
    PyEval_RestoreThread(unlocked);
    unlocked = NULL;
    result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)size);
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    free(out);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"region", region, METH_VARARGS, "region(data, plan) -> (pixels, rows, columns, top, left) | None"},
    {"restart", restart, METH_VARARGS, "restart(data) -> the JPEG rewritten losslessly with a restart marker every MCU | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
