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
 *   frame) or when plan returns None. Raises ValueError with libjpeg's message on what
 *   libjpeg refuses or warns about, and on data after the region's last row that does not end
 *   in the EOI marker (a truncated file); plan's exceptions propagate.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
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
    return Py_BuildValue("(NIIII)", (PyObject *)pixels, y1 - y0, width, y0, x);

decline:
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    Py_XDECREF((PyObject *)planned);
    Py_RETURN_NONE;
error:
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    Py_XDECREF((PyObject *)planned);
    Py_XDECREF((PyObject *)pixels);
    return NULL;
}

static PyMethodDef methods[] = {
    {"region", region, METH_VARARGS, "region(data, plan) -> (pixels, rows, columns, top, left) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_region", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
