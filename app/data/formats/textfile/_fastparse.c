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
 * On x86-64 a field with 16 bytes after its start and 8 before it in the buffer is first
 * read as one 16-byte vector (SSE2): its separators, digits and point found at once, so its
 * length is known without a loop; a plain field ([+-]digits[.digits], at most 8 digits on
 * each side of the point) is combined from the 64-bit words that end its two parts by SWAR
 * arithmetic (D. Lemire, "Number parsing at a gigabyte per second", Software: Practice and
 * Experience 51(8), 2021). Any other field takes the byte-at-a-time path. Both reach the
 * same mantissa and exponent, so the same value: 1.44x the parse rate of the byte path
 * alone on the seed's %.6g text (docs/performance.md, "The converter").
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
#if defined(__SSE2__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <emmintrin.h>
#define VECTOR 1
#else
#define VECTOR 0
#endif

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

#if VECTOR
#define ONES(b) (UINT64_C(0x0101010101010101) * (b))
static const uint64_t POW10_INT[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000,
                                      100000000};

/* The value of the n (1..8) ASCII digits that end just before `end`, most significant
 * first: the 64-bit word ending there with its other bytes cleared (they read as leading
 * zeros), eight digits combined by three multiply-shifts. */
static inline uint64_t digits_before(const unsigned char *end, int n)
{
    uint64_t w, keep = ~UINT64_C(0) << (8 * (8 - n) & 63);
    memcpy(&w, end - 8, 8);
    uint64_t v = (w & keep) - (ONES(0x30) & keep); /* each kept byte is >= '0': no borrow */
    v = v * 10 + (v >> 8);
    return (((v & UINT64_C(0x000000FF000000FF)) * (100 + (UINT64_C(1000000) << 32))) +
            (((v >> 16) & UINT64_C(0x000000FF000000FF)) * (1 + (UINT64_C(10000) << 32)))) >>
           32;
}

/* parse_field for a field with 16 readable bytes from *pp and 8 before it: a plain field
 * of at most 8 digits each side of the point here, any other by parse_field. */
static inline int parse_field_vector(const unsigned char **pp, float *value)
{
    const unsigned char *p = *pp;
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i from9 = _mm_sub_epi8(v, _mm_set1_epi8(9)), from0 = _mm_sub_epi8(v, _mm_set1_epi8('0'));
    __m128i space = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), /* or 9..13: \t..\r */
                                 _mm_cmpeq_epi8(_mm_min_epu8(from9, _mm_set1_epi8(4)), from9));
    __m128i digit = _mm_cmpeq_epi8(_mm_min_epu8(from0, _mm_set1_epi8(9)), from0);
    unsigned ends = (unsigned)_mm_movemask_epi8(space) | 0x10000u;
    unsigned digits = (unsigned)_mm_movemask_epi8(digit);
    unsigned points = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('.')));
    int len = __builtin_ctz(ends), sign = *p == '-' || *p == '+';
    unsigned body = ((1u << len) - 1) & ~(unsigned)sign; /* the bytes after the sign */
    points &= body;
    if (len == 16 || ((digits | points) & body) != body || (points & (points - 1)))
        return parse_field(pp, value); /* an exponent, another byte, a long field */
    int point = points ? __builtin_ctz(points) : len;
    int whole = point - sign, fraction = points ? len - point - 1 : 0;
    if (whole > 8 || fraction > 8 || whole + fraction == 0)
        return parse_field(pp, value);
    uint64_t m = whole > 1 ? digits_before(p + point, whole) : whole ? (uint64_t)(p[sign] - '0') : 0;
    if (fraction)
        m = m * POW10_INT[fraction] + digits_before(p + len, fraction);
    if (m > MAX_EXACT)
        return parse_field(pp, value);
    double d = m ? (double)m / POW10[fraction] : 0.0; /* one exact operation (Clinger) */
    *value = (float)(*p == '-' ? -d : d);
    *pp = p + len;
    return 1;
}
#define FAST_FIELD parse_field_vector
#else
#define FAST_FIELD parse_field
#endif

/* Whole lines of [p, stop) into out; [start, end) is the whole buffer, which the vector
 * path may read around a field. */
static Py_ssize_t parse_lines(const unsigned char *p, const unsigned char *stop,
                              const unsigned char *start, const unsigned char *end,
                              Py_ssize_t width, float *out, Py_ssize_t max_rows)
{
    /* Fields starting in [fast_from, fast_until] have 8 bytes before and 16 from them. */
    const unsigned char *fast_from = start + 8, *fast_until = end - start >= 24 ? end - 16 : start;
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
            if (fields == width)
                return rows;
            if (!(p >= fast_from && p <= fast_until ? FAST_FIELD(&p, row + fields)
                                                    : parse_field(&p, row + fields)))
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
    rows = parse_lines(base + begin, base + stop, base, base + text.len, width,
                       (float *)out.buf, max_rows);
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
