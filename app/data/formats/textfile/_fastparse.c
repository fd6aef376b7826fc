/*
 * app.data.formats.textfile._fastparse: the compiled fast path of app/data/formats/textfile/ (fast.py).
 *
 * parse_lines(buffer, begin, stop, width, out) -> rows
 *
 * Parses the lines buffer[begin:stop] (uint8; every line ends with '\n', so
 * buffer[stop - 1] == '\n') into out (a writable C-contiguous float32 buffer of
 * at least lines * width items), row by row, and returns how many whole lines it
 * parsed. It stops at the first line it does not take: a line with another
 * number of fields than width (a blank line included), a field that is not a
 * plain decimal ([+-]digits[.digits][(e|E)[+-]digits]), nan/inf, a byte outside
 * the whitespace set, or a value outside the exact range below. The caller
 * parses the rest with the general (numpy) path, which raises the precise error.
 *
 * Values are those of textfile/numpy_path.py and np.loadtxt: the decimal
 * rounded once to float64, that double rounded to float32. A mantissa m of at
 * most 19 significant digits and m <= 2**53 times or divided by 10**k with
 * k <= 22 is one correctly rounded IEEE operation on exact operands (Clinger's
 * fast path: W. D. Clinger, "How to read floating point numbers accurately",
 * PLDI 1990); anything else is left to the caller. Whitespace: space, \t, \r,
 * \v, \f between fields; \n ends a line (the set bytes.split() uses).
 *
 * count_newlines(text) counts the '\n' bytes of a buffer (memchr).
 *
 * newline_offsets(text, out) writes the offsets of the '\n' bytes of text, in
 * order, to the int64 buffer out, as many as it holds, and returns how many
 * there are in all (memchr; the reader's line ends).
 *
 * add_column_sums(values, width, sums, sums_sq) adds the column sums and sums of
 * squares of float32 rows to two float64 buffers (the cache's statistics), in the
 * order numpy's sum(axis=0) adds them.
 *
 * The GIL is released while parsing, counting and summing, so threads work in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const double POW10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

#define MAX_EXACT (UINT64_C(1) << 53)
#define IS_DIGIT(c) ((unsigned)((c) - '0') < 10u)
#define IS_BLANK(c) ((c) == ' ' || (c) == '\t' || (c) == '\r' || (c) == '\v' || (c) == '\f')

/* One field starting at *pp; 1 and the value on success (*pp just past it). */
static inline int parse_field(const unsigned char **pp, float *value)
{
    const unsigned char *p = *pp;
    int negative = 0, digits = 0, seen = 0, exponent = 0;
    uint64_t m = 0;
    unsigned char c = *p;

    if (c == '-' || c == '+') {
        negative = c == '-';
        c = *++p;
    }
    while (c == '0') { /* leading zeros are not significant */
        seen = 1;
        c = *++p;
    }
    while (IS_DIGIT(c)) {
        if (++digits > 19)
            return 0;
        m = 10 * m + (uint64_t)(c - '0');
        seen = 1;
        c = *++p;
    }
    if (c == '.') {
        c = *++p;
        if (!digits) {
            while (c == '0') {
                seen = 1;
                exponent--;
                c = *++p;
            }
        }
        while (IS_DIGIT(c)) {
            if (++digits > 19)
                return 0;
            m = 10 * m + (uint64_t)(c - '0');
            exponent--;
            seen = 1;
            c = *++p;
        }
    }
    if (!seen)
        return 0;
    if (c == 'e' || c == 'E') {
        int e = 0, e_negative = 0, e_digits = 0;
        c = *++p;
        if (c == '-' || c == '+') {
            e_negative = c == '-';
            c = *++p;
        }
        while (IS_DIGIT(c)) {
            if (++e_digits > 4)
                return 0;
            e = 10 * e + (c - '0');
            c = *++p;
        }
        if (!e_digits)
            return 0;
        exponent += e_negative ? -e : e;
    }
    if (!(IS_BLANK(c) || c == '\n'))
        return 0;
    double d;
    if (m == 0) {
        d = 0.0;
    } else if (m <= MAX_EXACT && exponent >= -22 && exponent <= 22) {
        d = (double)m;
        d = exponent < 0 ? d / POW10[-exponent] : d * POW10[exponent];
    } else {
        return 0;
    }
    *value = (float)(negative ? -d : d);
    *pp = p;
    return 1;
}

static Py_ssize_t parse_lines(const unsigned char *p, const unsigned char *stop,
                              Py_ssize_t width, float *out, Py_ssize_t max_rows)
{
    Py_ssize_t rows = 0;
    while (p < stop && rows < max_rows) {
        float *row = out + rows * width;
        Py_ssize_t fields = 0;
        for (;;) {
            while (IS_BLANK(*p))
                p++;
            if (*p == '\n') {
                p++;
                break;
            }
            if (fields == width || !parse_field(&p, row + fields))
                return rows;
            fields++;
        }
        if (fields != width)
            return rows;
        rows++;
    }
    return rows;
}

static PyObject *py_parse_lines(PyObject *self, PyObject *args)
{
    Py_buffer text, out;
    Py_ssize_t begin, stop, width, rows;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &text, &begin, &stop, &width, &out))
        return NULL;
    if (width < 1 || begin < 0 || stop > text.len || begin > stop ||
        (stop > begin && ((const unsigned char *)text.buf)[stop - 1] != '\n')) {
        PyBuffer_Release(&text);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError,
                        "parse_lines: need 0 <= begin <= stop <= len(text), text[stop-1] == "
                        "'\\n', width >= 1");
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)text.buf;
    Py_ssize_t max_rows = out.len / (Py_ssize_t)sizeof(float) / width;
    Py_BEGIN_ALLOW_THREADS
    rows = parse_lines(base + begin, base + stop, width, (float *)out.buf, max_rows);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&text);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(rows);
}

static PyObject *py_add_column_sums(PyObject *self, PyObject *args)
{
    Py_buffer values, sums, sums_sq;
    Py_ssize_t width;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nw*w*", &values, &width, &sums, &sums_sq))
        return NULL;
    if (width < 1 || values.len % (width * (Py_ssize_t)sizeof(float)) ||
        sums.len != width * (Py_ssize_t)sizeof(double) ||
        sums_sq.len != width * (Py_ssize_t)sizeof(double)) {
        PyBuffer_Release(&values);
        PyBuffer_Release(&sums);
        PyBuffer_Release(&sums_sq);
        PyErr_SetString(PyExc_ValueError,
                        "add_column_sums: need float32 rows of width values and two float64 "
                        "buffers of width values");
        return NULL;
    }
    const float *v = (const float *)values.buf;
    double *s = (double *)sums.buf, *q = (double *)sums_sq.buf;
    Py_ssize_t rows = values.len / (Py_ssize_t)sizeof(float) / width;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++, v += width) {
        for (Py_ssize_t j = 0; j < width; j++) {
            double x = (double)v[j];
            s[j] += x;
            q[j] += x * x;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&sums);
    PyBuffer_Release(&sums_sq);
    Py_RETURN_NONE;
}

static PyObject *py_count_newlines(PyObject *self, PyObject *args)
{
    Py_buffer text;
    Py_ssize_t count = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &text))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    const char *p = (const char *)text.buf, *end = p + text.len;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        count++;
        p++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&text);
    return PyLong_FromSsize_t(count);
}

static PyObject *py_newline_offsets(PyObject *self, PyObject *args)
{
    Py_buffer text, out;
    Py_ssize_t count = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &text, &out))
        return NULL;
    Py_ssize_t room = out.len / (Py_ssize_t)sizeof(int64_t);
    Py_BEGIN_ALLOW_THREADS
    const char *base = (const char *)text.buf, *p = base, *end = base + text.len;
    int64_t *offsets = (int64_t *)out.buf;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        if (count < room)
            offsets[count] = (int64_t)(p - base);
        count++;
        p++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&text);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"parse_lines", py_parse_lines, METH_VARARGS,
     "parse_lines(text, begin, stop, width, out) -> rows: whole lines of text[begin:stop] "
     "parsed into the float32 buffer out (see app/data/formats/textfile/_fastparse.c)."},
    {"count_newlines", py_count_newlines, METH_VARARGS,
     "count_newlines(text) -> the number of b'\\n' bytes in text."},
    {"newline_offsets", py_newline_offsets, METH_VARARGS,
     "newline_offsets(text, out) -> count: the offsets of text's b'\\n' bytes written to the "
     "int64 buffer out (as many as it holds); how many there are in all."},
    {"add_column_sums", py_add_column_sums, METH_VARARGS,
     "add_column_sums(values, width, sums, sums_sq): add the float32 rows' column sums and "
     "sums of squares, in float64, row by row, to the float64 buffers sums and sums_sq."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastparse",
    "Compiled fast path of app.data.formats.textfile (plain decimals to float32).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastparse(void) { return PyModule_Create(&module); }
