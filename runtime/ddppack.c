/* ddppack.c: `ddppack DIR OUT --size H[xW]` packs a folder of JPEG and PNG images, one
 * subfolder per class (torchvision's ImageFolder layout, ImageNet's), into NumPy files
 * that a program reads as one dataset with two patterns:
 *
 *   OUT/images-00000.npy ...  (n, H, W, 3) uint8, RGB
 *   OUT/labels-00000.npy ...  (n,) int32: the class's place among the subfolders
 *   OUT/classes.txt           the class names, one a line, in the labels' order
 *
 * Classes are the subfolders in byte order of their names, as are the images within
 * each (names ending .jpg, .jpeg or .png in any case; other files are counted and
 * left). An image is read as what its first bytes say it is, whatever its name (one
 * of ImageNet's ".JPEG" files is a PNG), and decoded (a JPEG at the smallest of
 * libjpeg's scales that keeps the pixels needed), resized so that its shorter side is
 * --resize (default: the larger of H and W) with an antialiased bilinear filter, and
 * its centre H x W kept: torchvision's Resize(S) then CenterCrop(H). Grayscale, CMYK
 * and palette images become RGB; a PNG's alpha is dropped (as PIL's convert("RGB")
 * does) and 16-bit values become 8-bit.
 *
 * Nothing is half-written: each file is written beside its name and renamed when
 * whole, and a bad image (damaged, cut short, not a JPEG or PNG) stops the packing with its
 * path and status 1, removing what this run wrote, unless --skip-bad leaves it out
 * (every skipped file listed, and in OUT/skipped.txt). Threads decode the images of a
 * file together; the files are the same bits whatever their number. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "resample.h"

static const char usage[] =
    "usage: ddppack DIR OUT --size H[xW] [--resize S] [--per-file N] [--threads N] [--skip-bad]\n"
    "Packs DIR's JPEG and PNG images, one subfolder per class, into NumPy files in OUT:\n"
    "images-NNNNN.npy (n, H, W, 3) uint8 and labels-NNNNN.npy (n,) int32, with classes.txt.\n"
    "  --size H[xW]   the images' height and width in the files (W = H if left out)\n"
    "  --resize S     the shorter side each image is resized to before its centre H x W is\n"
    "                 kept (default: the larger of H and W; 256 with --size 224 is ImageNet's)\n"
    "  --per-file N   images in each file (default 4096)\n"
    "  --threads N    threads decoding (default: the CPUs this process may use)\n"
    "  --skip-bad     leave out images that cannot be decoded, listing them, instead of stopping\n"
    "Exit status: 0 done, 1 an error (a bad image, a file that cannot be written), 2 bad usage.\n";

/* MAX_PIXELS: the most a decoded image may hold (at the scale it is decoded at), so a
 * header claiming a huge image names it rather than exhausting memory. */
enum { MAX_SIDE = 65536, ERR = 1024, MAX_PIXELS = 1 << 28 };

typedef struct Options {
    const char *dir, *out;
    int height, width, resize;
    long per_file;
    int threads;
    bool skip_bad;
} Options;

typedef struct Image {
    char *path;
    int32_t label;
} Image;

typedef struct Dataset {
    char **classes;
    int nclasses;
    Image *images;
    long nimages, cap;
    long others;          /* files not named as JPEG or PNG images, left out */
    char other[1024];     /* the first of them, for the summary */
} Dataset;

static int bad_usage(const char *fmt, const char *arg) {
    fprintf(stderr, "ddppack: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

/* n: the bytes that could not be had, or 0 where a library does not say. */
static _Noreturn void out_of_memory(size_t n) {
    if (n)
        fprintf(stderr, "ddppack: out of memory (%zu bytes)\n", n);
    else
        fprintf(stderr, "ddppack: out of memory\n");
    exit(1);
}

static void *must_alloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        out_of_memory(n);
    return p;
}

/* p grown to n bytes (realloc), or the program ended as must_alloc ends it. */
static void *grow(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "ddppack: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return q;
}

static char *copy_text(const char *text) {
    size_t n = strlen(text) + 1;
    return memcpy(must_alloc(n), text, n);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = must_alloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ listing */

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_png_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && strcasecmp(dot, ".png") == 0;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return is_png_name(name) || (dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0));
}

/* The names in dir that are folders (want_dirs) or files, hidden ones left out, in
 * byte order; NULL with a message when dir cannot be read. */
static char **list_names(const char *dir, bool want_dirs, int *count) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "ddppack: %s: cannot read the folder: %s\n", dir, strerror(errno));
        return NULL;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char *path = join(dir, e->d_name);
        struct stat st;
        bool ok = stat(path, &st) == 0 && (want_dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
        free(path);
        if (!ok)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = grow(names, (size_t)cap * sizeof *names);
        }
        names[n++] = copy_text(e->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, (size_t)n, sizeof *names, by_name);
    *count = n;
    return names ? names : must_alloc(sizeof(char *));
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void add_image(Dataset *ds, char *path, int label) {
    if (ds->nimages == ds->cap) {
        ds->cap = ds->cap ? 2 * ds->cap : 1024;
        ds->images = grow(ds->images, (size_t)ds->cap * sizeof *ds->images);
    }
    ds->images[ds->nimages++] = (Image){path, label};
}

/* Every class folder of dir and its images; false with a message. */
static bool list_dataset(const char *dir, Dataset *ds) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ddppack: %s: %s; DIR is a folder holding one subfolder of images per class\n", dir,
                stat(dir, &st) != 0 ? strerror(errno) : "not a folder");
        return false;
    }
    if (!(ds->classes = list_names(dir, true, &ds->nclasses)))
        return false;
    if (ds->nclasses == 0) {
        fprintf(stderr, "ddppack: %s holds no class folder: it should hold one subfolder of images per class "
                        "(DIR/CLASS/IMAGE.jpg)\n", dir);
        return false;
    }
    for (int c = 0; c < ds->nclasses; c++) {
        char *class_dir = join(dir, ds->classes[c]);
        int n;
        char **files = list_names(class_dir, false, &n);
        if (!files) {
            free(class_dir);
            return false;
        }
        long before = ds->nimages;
        for (int i = 0; i < n; i++) {
            if (is_image_name(files[i])) {
                add_image(ds, join(class_dir, files[i]), c);
            } else if (ds->others++ == 0) {
                snprintf(ds->other, sizeof ds->other, "%s/%s", class_dir, files[i]);
            }
        }
        free_names(files, n);
        if (ds->nimages == before) {
            fprintf(stderr, "ddppack: %s: the class `%s` holds no image (.jpg, .jpeg or .png): every class "
                            "folder needs one\n", class_dir, ds->classes[c]);
            free(class_dir);
            return false;
        }
        free(class_dir);
    }
    return true;
}

/* ------------------------------------------------------------------ decoding */

typedef struct Failure {
    struct jpeg_error_mgr mgr;
    jmp_buf back;
    char message[JMSG_LENGTH_MAX];
} Failure;

static void on_error(j_common_ptr c) {
    Failure *f = (Failure *)c->err;
    c->err->format_message(c, f->message);
    longjmp(f->back, 1);
}

/* A warning is a damaged image too (libjpeg would fill what is missing with grey),
 * but for bytes between its parts, which lose nothing (a few of ImageNet's have them). */
static void on_message(j_common_ptr c, int level) {
    if (level < 0 && c->err->msg_code != JWRN_EXTRANEOUS_DATA)
        on_error(c);
}

/* A decoded image: rows of width x 3 bytes. */
typedef struct Pixels {
    unsigned char *rgb;
    int width, height;
} Pixels;

static bool read_whole(const char *path, unsigned char **data, size_t *len, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, ERR, "cannot open it: %s", strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size <= 0) {
        snprintf(err, ERR, "it is empty");
        fclose(f);
        return false;
    }
    *len = (size_t)st.st_size;
    *data = must_alloc(*len);
    bool ok = fread(*data, 1, *len, f) == *len;
    fclose(f);
    if (!ok)
        snprintf(err, ERR, "cannot read it: %s", strerror(errno));
    return ok;
}

/* CMYK as Adobe writes it (inverted) or plain, to RGB. */
static void cmyk_to_rgb(unsigned char *row, int width, bool inverted) {
    for (int x = 0; x < width; x++) {
        unsigned char *p = row + 4 * x;
        int c = p[0], m = p[1], y = p[2], k = p[3];
        if (!inverted)
            c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        row[3 * x + 0] = (unsigned char)((c * k + 127) / 255);
        row[3 * x + 1] = (unsigned char)((m * k + 127) / 255);
        row[3 * x + 2] = (unsigned char)((y * k + 127) / 255);
    }
}

/* Decodes data at the smallest scale M/8 whose shorter side is at least shorter_min. */
static bool decode_jpeg(const unsigned char *data, size_t len, int shorter_min, Pixels *px, char *err) {
    struct jpeg_decompress_struct c;
    Failure f;
    c.err = jpeg_std_error(&f.mgr);
    f.mgr.error_exit = on_error;
    f.mgr.emit_message = on_message;
    unsigned char *volatile rgb = NULL;
    if (setjmp(f.back)) {
        snprintf(err, ERR, "not a readable JPEG image: %s", f.message);
        jpeg_destroy_decompress(&c);
        free(rgb);
        return false;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, data, (unsigned long)len);
    jpeg_read_header(&c, TRUE);
    bool cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
    c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    for (int m = 1; m <= 8; m++) {
        c.scale_num = (unsigned)m;
        c.scale_denom = 8;
        jpeg_calc_output_dimensions(&c);
        int shorter = c.output_width < c.output_height ? (int)c.output_width : (int)c.output_height;
        if (shorter >= shorter_min)
            break;
    }
    if ((uint64_t)c.output_width * c.output_height > MAX_PIXELS) {
        snprintf(err, ERR, "it says it is %u x %u pixels, more than ddppack decodes (%d pixels at the scale it "
                 "needs)", c.image_width, c.image_height, MAX_PIXELS);
        jpeg_destroy_decompress(&c);
        return false;
    }
    jpeg_start_decompress(&c);
    int w = (int)c.output_width, h = (int)c.output_height, channels = c.output_components;
    rgb = must_alloc((size_t)w * (size_t)h * (size_t)channels);
    while (c.output_scanline < c.output_height) {
        JSAMPROW row = rgb + (size_t)c.output_scanline * (size_t)w * 3;
        if (cmyk) /* a CMYK row is wider: decode it apart, then narrow it in place */
            row = rgb + (size_t)c.output_scanline * (size_t)w * 4;
        jpeg_read_scanlines(&c, &row, 1);
    }
    if (cmyk) /* rows in 4-byte pixels, turned to 3 from the first on (never overtaking) */
        for (int y = 0; y < h; y++) {
            unsigned char *src = rgb + (size_t)y * (size_t)w * 4;
            cmyk_to_rgb(src, w, c.saw_Adobe_marker);
            memmove(rgb + (size_t)y * (size_t)w * 3, src, (size_t)w * 3);
        }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    px->rgb = rgb;
    px->width = w;
    px->height = h;
    return true;
}

/* A PNG being read from memory, and how its reading failed. */
typedef struct PngRead {
    const unsigned char *data;
    size_t len, at;
    jmp_buf back;
    char message[200];
} PngRead;

static void png_from_memory(png_structp png, png_bytep out, size_t n) {
    PngRead *r = png_get_io_ptr(png);
    if (n > r->len - r->at)
        png_error(png, "the file is cut short");
    memcpy(out, r->data + r->at, n);
    r->at += n;
}

static void on_png_error(png_structp png, png_const_charp message) {
    PngRead *r = png_get_error_ptr(png);
    snprintf(r->message, sizeof r->message, "%s", message);
    longjmp(r->back, 1);
}

/* libpng warns of what costs no pixel (a colour profile it finds odd, a damaged
 * ancillary chunk): none of it is damage to the image. */
static void on_png_warning(png_structp png, png_const_charp message) {
    (void)png, (void)message;
}

/* Decodes a PNG as 8-bit RGB as PIL's convert("RGB") makes it: palettes and grey
 * expanded, 16-bit values scaled to 8 (rounded), alpha and transparency dropped, and
 * no gamma applied. */
static bool decode_png(const unsigned char *data, size_t len, Pixels *px, char *err) {
    PngRead r = {.data = data, .len = len};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info)
        out_of_memory(0);
    unsigned char *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(r.back)) {
        snprintf(err, ERR, "not a readable PNG image: %s", r.message);
        png_destroy_read_struct(&png, &info, NULL);
        free(rgb);
        free(rows);
        return false;
    }
    png_set_read_fn(png, &r, png_from_memory);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if ((uint64_t)w * h > MAX_PIXELS) {
        snprintf(err, ERR, "it says it is %u x %u pixels, more than ddppack decodes (%d pixels)", (unsigned)w,
                 (unsigned)h, MAX_PIXELS);
        png_destroy_read_struct(&png, &info, NULL);
        return false;
    }
    png_set_scale_16(png);
    png_set_palette_to_rgb(png);
    png_set_expand_gray_1_2_4_to_8(png);
    png_set_gray_to_rgb(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3)
        png_error(png, "its pixels do not become 3 bytes");
    rgb = must_alloc((size_t)w * h * 3);
    rows = must_alloc((size_t)h * sizeof *rows);
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    px->rgb = rgb;
    px->width = (int)w;
    px->height = (int)h;
    return true;
}

/* An image as its first bytes say (JPEG's start of image, PNG's signature) or, where
 * they say neither, as its name does, so that the message is the decoder's. */
static bool decode(const char *path, const unsigned char *data, size_t len, int shorter_min, Pixels *px,
                   char *err) {
    static const unsigned char jpeg_start[] = {0xff, 0xd8}, png_start[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    bool jpeg = len >= sizeof jpeg_start && memcmp(data, jpeg_start, sizeof jpeg_start) == 0;
    bool png = len >= sizeof png_start && memcmp(data, png_start, sizeof png_start) == 0;
    if (png || (!jpeg && is_png_name(path)))
        return decode_png(data, len, px, err);
    return decode_jpeg(data, len, shorter_min, px, err);
}

/* ------------------------------------------------------------------ resizing */

/* Taps for a side of in pixels resized to size, of which count are kept from offset. */
static ddp_taps side_taps(int in, int size, int offset, int count) {
    ddp_taps t;
    if (!ddp_taps_init(&t, count, ddp_taps_span(in, size)))
        out_of_memory((size_t)count * (size_t)ddp_taps_span(in, size) * sizeof(float));
    ddp_taps_set(&t, 0, in, size, offset);
    return t;
}

/* px resized so its shorter side is resize, its centre height x width into out. */
static void resize_centre(const Pixels *px, int resize, int height, int width, unsigned char *out) {
    int rw, rh;
    if (px->width <= px->height)
        rw = resize, rh = (int)((int64_t)resize * px->height / px->width);
    else
        rh = resize, rw = (int)((int64_t)resize * px->width / px->height);
    int top = (int)floor((rh - height) / 2.0 + 0.5), left = (int)floor((rw - width) / 2.0 + 0.5);
    ddp_taps cols = side_taps(px->width, rw, left, width), rows = side_taps(px->height, rh, top, height);
    /* the first pass over the input rows the kept rows need, the columns they read */
    int64_t first = rows.first[0], last = rows.first[height - 1] + rows.n[height - 1];
    int64_t from = cols.first[0], to = cols.first[width - 1] + cols.n[width - 1];
    float *mid = must_alloc((size_t)(last - first) * (size_t)width * 3 * sizeof(float));
    int64_t line_len = to - from > width ? to - from : width; /* an input row, then an output row */
    float *line = must_alloc((size_t)line_len * 3 * sizeof(float));
    for (int64_t y = first; y < last; y++) {
        const unsigned char *src = px->rgb + ((size_t)y * (size_t)px->width + (size_t)from) * 3;
        for (int64_t v = 0; v < (to - from) * 3; v++)
            line[v] = src[v];
        ddp_resample_row(&cols, line, from, 3, mid + (size_t)(y - first) * (size_t)width * 3);
    }
    for (int y = 0; y < height; y++) {
        ddp_resample_column(&rows, y, mid, first, (int64_t)width * 3, line);
        for (int x = 0; x < width * 3; x++) {
            long v = lrintf(line[x]);
            out[(size_t)y * (size_t)width * 3 + (size_t)x] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    free(line);
    free(mid);
    ddp_taps_free(&cols);
    ddp_taps_free(&rows);
}

/* ------------------------------------------------------------------ one file */

typedef struct Part {
    const Options *o;
    const Image *images;    /* the file's */
    long count;
    unsigned char *pixels;  /* count x H x W x 3 */
    char (*errors)[ERR];    /* per image; "" when it decoded */
    long next;
    pthread_mutex_t mu;
} Part;

static void pack_one(const Options *o, const Image *im, unsigned char *out, char *err) {
    unsigned char *data = NULL;
    size_t len = 0;
    Pixels px = {0};
    if (read_whole(im->path, &data, &len, err) && decode(im->path, data, len, o->resize, &px, err))
        resize_centre(&px, o->resize, o->height, o->width, out);
    free(px.rgb);
    free(data);
}

static void *decode_worker(void *arg) {
    Part *p = arg;
    size_t bytes = (size_t)p->o->height * (size_t)p->o->width * 3;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        long i = p->next++;
        pthread_mutex_unlock(&p->mu);
        if (i >= p->count)
            return NULL;
        p->errors[i][0] = 0;
        pack_one(p->o, &p->images[i], p->pixels + (size_t)i * bytes, p->errors[i]);
    }
}

/* Writes the pieces one after another beside path, syncs and renames them over it, so
 * path is whole or not there; false with a message naming path. */
static bool write_whole(const char *path, const void *const *pieces, const size_t *lens, int n) {
    size_t plen = strlen(path) + 9;
    char *tmp = must_alloc(plen);
    snprintf(tmp, plen, "%s.partial", path);
    FILE *f = fopen(tmp, "wb");
    bool ok = f != NULL;
    for (int i = 0; i < n && ok; i++)
        ok = fwrite(pieces[i], 1, lens[i], f) == lens[i];
    int saved = errno;
    if (f && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        ok = false, saved = errno;
    if (f && fclose(f) != 0 && ok)
        ok = false, saved = errno;
    if (ok && rename(tmp, path) != 0)
        ok = false, saved = errno;
    if (!ok) {
        fprintf(stderr, "ddppack: %s: cannot write it: %s\n", path, strerror(saved));
        unlink(tmp);
    }
    free(tmp);
    return ok;
}

/* An .npy file (version 1.0) of the given dtype and shape. */
static bool write_npy(const char *path, const char *descr, const long *shape, int rank, const void *data,
                      size_t bytes) {
    char dims[256] = "", header[512];
    size_t used = 0;
    for (int i = 0; i < rank; i++)
        used += (size_t)snprintf(dims + used, sizeof dims - used, "%ld,%s", shape[i], i + 1 < rank ? " " : "");
    if (rank > 1) /* (n, h, w, 3): no trailing comma past the first axis */
        dims[used - 1] = 0;
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    int total = (10 + n + 1 + 63) / 64 * 64; /* magic, version, length, dict, newline: a multiple of 64 */
    memset(header + n, ' ', (size_t)(total - 10 - n - 1));
    header[total - 10 - 1] = '\n';
    unsigned char lead[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((total - 10) & 0xff),
                              (unsigned char)((total - 10) >> 8)};
    const void *pieces[3] = {lead, header, data};
    size_t lens[3] = {sizeof lead, (size_t)(total - 10), bytes};
    return write_whole(path, pieces, lens, 3);
}

/* ------------------------------------------------------------------ the run */

typedef struct Written {
    char **paths;
    int n, cap;
} Written;

static void remember(Written *w, char *path) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->paths = grow(w->paths, (size_t)w->cap * sizeof *w->paths);
    }
    w->paths[w->n++] = path;
}

/* A failed run leaves OUT as it found it. */
static void remove_written(Written *w) {
    for (int i = 0; i < w->n; i++)
        unlink(w->paths[i]);
}

/* A text file of the lines, each ended by a newline. */
static bool write_lines(const char *path, char *const *lines, long n) {
    size_t bytes = 0;
    for (long i = 0; i < n; i++)
        bytes += strlen(lines[i]) + 1;
    char *text = must_alloc(bytes + 1), *at = text; /* sprintf's last zero */
    for (long i = 0; i < n; i++)
        at += sprintf(at, "%s\n", lines[i]);
    const void *pieces[1] = {text};
    bool ok = write_whole(path, pieces, &bytes, 1);
    free(text);
    return ok;
}

static bool prepare_out(const char *out) {
    struct stat st;
    if (stat(out, &st) != 0) {
        if (mkdir(out, 0777) != 0) {
            fprintf(stderr, "ddppack: %s: cannot make the folder: %s\n", out, strerror(errno));
            return false;
        }
        return true;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ddppack: %s: not a folder; OUT is the folder the packed files go to\n", out);
        return false;
    }
    int n;
    char **names = list_names(out, false, &n);
    if (!names)
        return false;
    bool clean = true;
    for (int i = 0; i < n && clean; i++)
        if ((strncmp(names[i], "images-", 7) == 0 || strncmp(names[i], "labels-", 7) == 0) &&
            strstr(names[i], ".npy")) {
            fprintf(stderr, "ddppack: %s already holds packed files (%s): a dataset read as images-*.npy "
                            "would mix two packings; give another folder, or remove them\n", out, names[i]);
            clean = false;
        }
    free_names(names, n);
    return clean;
}

static int allowed_cpus(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

static bool parse_count(const char *text, long lo, long hi, long *v) {
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (errno || end == text || *end || n < lo || n > hi)
        return false;
    *v = n;
    return true;
}

/* 0: options parsed; else the exit status. */
static int parse_options(int argc, char **argv, Options *o) {
    *o = (Options){.per_file = 4096, .threads = allowed_cpus()};
    long resize = 0;
    const char *positional[2];
    int npositional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return -1;
        }
        if (strcmp(a, "--skip-bad") == 0) {
            o->skip_bad = true;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            if (i + 1 >= argc)
                return bad_usage("%s needs a value", a);
            const char *v = argv[++i];
            long n;
            if (strcmp(a, "--size") == 0) {
                char *x = strchr(v, 'x');
                char first[32];
                snprintf(first, sizeof first, "%.*s", x ? (int)(x - v) : (int)strlen(v), v);
                long h, w;
                if (!parse_count(first, 1, MAX_SIDE, &h) || !parse_count(x ? x + 1 : first, 1, MAX_SIDE, &w))
                    return bad_usage("--size takes H or HxW, whole numbers of pixels from 1 to 65536, not `%s`", v);
                o->height = (int)h;
                o->width = (int)w;
            } else if (strcmp(a, "--resize") == 0) {
                if (!parse_count(v, 1, MAX_SIDE, &resize))
                    return bad_usage("--resize takes a number of pixels from 1 to 65536, not `%s`", v);
            } else if (strcmp(a, "--per-file") == 0) {
                if (!parse_count(v, 1, 1L << 30, &o->per_file))
                    return bad_usage("--per-file takes a number of images from 1 on, not `%s`", v);
            } else if (strcmp(a, "--threads") == 0) {
                if (!parse_count(v, 1, 1024, &n))
                    return bad_usage("--threads takes a number from 1 to 1024, not `%s`", v);
                o->threads = (int)n;
            } else {
                return bad_usage("unknown option `%s`", a);
            }
            continue;
        }
        if (npositional == 2)
            return bad_usage("one DIR and one OUT, not also `%s`", a);
        positional[npositional++] = a;
    }
    if (npositional < 2)
        return bad_usage("%s", npositional ? "no OUT folder given" : "no DIR and OUT folders given");
    if (!o->height)
        return bad_usage("%s", "--size H[xW] is needed: the images' height and width in the files");
    o->dir = positional[0];
    o->out = positional[1];
    int larger = o->height > o->width ? o->height : o->width;
    o->resize = resize ? (int)resize : larger;
    if (o->resize < larger) {
        char text[64];
        snprintf(text, sizeof text, "%d", larger);
        return bad_usage("--resize must be at least the larger of the size's sides (%s): the centre is cut from "
                         "the resized image",
                         text);
    }
    return 0;
}

/* Decodes file f's images (first .. first + count) on the threads; the bad ones are
 * reported and, with --skip-bad, left out (kept moves the good ones up). */
static bool pack_file(const Options *o, const Dataset *ds, long first, long count, unsigned char *pixels,
                      int32_t *labels, long *kept, char ***skipped, long *nskipped) {
    Part p = {o, ds->images + first, count, pixels, must_alloc((size_t)count * ERR), 0, PTHREAD_MUTEX_INITIALIZER};
    int threads = o->threads < count ? o->threads : (int)count;
    pthread_t *t = must_alloc((size_t)threads * sizeof *t);
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&t[started], NULL, decode_worker, &p) != 0)
            break;
    decode_worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    free(t);
    size_t bytes = (size_t)o->height * (size_t)o->width * 3;
    bool ok = true;
    *kept = 0;
    for (long i = 0; i < count && ok; i++) {
        const Image *im = &ds->images[first + i];
        if (p.errors[i][0]) {
            fprintf(stderr, "ddppack: %s: %s%s\n", im->path, p.errors[i],
                    o->skip_bad ? " (left out: --skip-bad)" : "; --skip-bad leaves such images out");
            if (!o->skip_bad) {
                ok = false;
                break;
            }
            *skipped = grow(*skipped, (size_t)(*nskipped + 1) * sizeof **skipped);
            (*skipped)[(*nskipped)++] = im->path;
            continue;
        }
        if (*kept != i)
            memmove(pixels + (size_t)*kept * bytes, pixels + (size_t)i * bytes, bytes);
        labels[(*kept)++] = im->label;
    }
    free(p.errors);
    pthread_mutex_destroy(&p.mu);
    return ok;
}

static char *numbered(const char *out, const char *kind, int digits, long index) {
    char name[64];
    snprintf(name, sizeof name, "%s-%0*ld.npy", kind, digits, index);
    return join(out, name);
}

static void free_dataset(Dataset *ds) {
    for (long i = 0; i < ds->nimages; i++)
        free(ds->images[i].path);
    free(ds->images);
    free_names(ds->classes, ds->nclasses);
}

static int run(const Options *o) {
    Dataset ds = {0};
    if (!list_dataset(o->dir, &ds) || !prepare_out(o->out)) {
        free_dataset(&ds);
        return 1;
    }
    double start = now();
    long files = (ds.nimages + o->per_file - 1) / o->per_file;
    int digits = 5;
    for (long n = files - 1; n >= 100000; n /= 10)
        digits++;
    size_t bytes = (size_t)o->height * (size_t)o->width * 3;
    long most = ds.nimages < o->per_file ? ds.nimages : o->per_file;
    unsigned char *pixels = must_alloc((size_t)most * bytes);
    int32_t *labels = must_alloc((size_t)most * sizeof *labels);
    Written written = {0};
    char **skipped = NULL;
    long nskipped = 0, total = 0, index = 0;
    bool ok = true;
    for (long f = 0; f < files && ok; f++) {
        long first = f * o->per_file, count = ds.nimages - first < o->per_file ? ds.nimages - first : o->per_file;
        long kept;
        ok = pack_file(o, &ds, first, count, pixels, labels, &kept, &skipped, &nskipped);
        if (!ok || kept == 0)
            continue;
        char *images = numbered(o->out, "images", digits, index), *label_file = numbered(o->out, "labels", digits, index);
        long image_shape[4] = {kept, o->height, o->width, 3}, label_shape[1] = {kept};
        ok = write_npy(images, "|u1", image_shape, 4, pixels, (size_t)kept * bytes);
        if (ok)
            remember(&written, images);
        else
            free(images);
        ok = ok && write_npy(label_file, "<i4", label_shape, 1, labels, (size_t)kept * sizeof *labels);
        if (ok)
            remember(&written, label_file);
        else
            free(label_file);
        total += kept;
        index++;
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\rddppack: %ld of %ld images", first + count, ds.nimages);
    }
    if (isatty(STDERR_FILENO))
        fputc('\n', stderr);
    char *classes = join(o->out, "classes.txt"), *skipped_file = join(o->out, "skipped.txt");
    if (ok && total == 0) {
        fprintf(stderr, "ddppack: every image of %s was bad: nothing to pack\n", o->dir);
        ok = false;
    }
    ok = ok && write_lines(classes, ds.classes, ds.nclasses);
    if (ok)
        remember(&written, classes);
    ok = ok && (nskipped == 0 || write_lines(skipped_file, skipped, nskipped));
    if (!ok) {
        remove_written(&written);
        fprintf(stderr, "ddppack: nothing was packed into %s\n", o->out);
    } else {
        double seconds = now() - start;
        printf("ddppack: %ld images of %d classes from %s into %ld file%s of at most %ld in %s: [%d, %d, %d] "
               "uint8, %.1f MiB; %.1f s (%.0f images/s, %d thread%s)\n",
               total, ds.nclasses, o->dir, index, index == 1 ? "" : "s", o->per_file, o->out, o->height, o->width,
               3, (double)total * (double)bytes / (1 << 20), seconds, (double)(total + nskipped) / seconds,
               o->threads, o->threads == 1 ? "" : "s");
        if (nskipped)
            printf("ddppack: %ld bad image%s left out, listed in %s\n", nskipped, nskipped == 1 ? "" : "s", skipped_file);
        if (ds.others)
            printf("ddppack: %ld file%s not named .jpg, .jpeg or .png left out (%s%s)\n", ds.others,
                   ds.others == 1 ? "" : "s", ds.other, ds.others > 1 ? ", ..." : "");
        printf("read it as: npy(inputs = \"%s/images-*.npy\", labels = \"%s/labels-*.npy\", scale = 1 / 255)\n",
               o->out, o->out);
    }
    bool classes_written = written.n > 0 && written.paths[written.n - 1] == classes;
    for (int i = 0; i < written.n; i++)
        free(written.paths[i]);
    if (!classes_written)
        free(classes);
    free(skipped_file);
    free(written.paths);
    free(skipped);
    free(pixels);
    free(labels);
    free_dataset(&ds);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    Options o;
    int status = parse_options(argc, argv, &o);
    if (status != 0)
        return status < 0 ? 0 : status;
    return run(&o);
}
