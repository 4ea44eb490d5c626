/* data_csv.c: numeric columns of a CSV file: the features become a sample's inputs
 * (f64, one value each, in the order the dataset lists them) and the target its label.
 *
 * The syntax is RFC 4180's: fields separated by commas, optionally in double quotes
 * (a quote inside written twice), records ending in LF or CRLF, the last one's line end
 * optional; blank lines at the end are ignored. With header = true the first record
 * names the columns; without it, features and target are column numbers from 0. Every
 * feature and target cell must hold a finite number, and one that does not is reported
 * at its line and column, the way a compiler reports an error. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_read.h"

/* The unread text; fields are unquoted and NUL-terminated in place. */
typedef struct csv_reader {
    const char *path;
    char *p, *end;
    int64_t line, column; /* of p, 1-based; the column counts characters, not bytes */
} csv_reader;

typedef struct csv_field {
    char *text;
    int64_t line, column; /* where it starts */
} csv_field;

typedef struct csv_record {
    csv_field *fields;
    int64_t count, capacity;
    int64_t line;
} csv_record;

/* The columns a dataset reads: its features, then its target. */
typedef struct csv_columns {
    int64_t *index;
    const char **name; /* from the header; NULL without one */
    int64_t count;
    int64_t width; /* fields per record */
} csv_columns;

/* "FILE:LINE:COLUMN: message", or "FILE:LINE: message" with column 0. */
__attribute__((format(printf, 6, 7))) static bool fail_at(const csv_reader *r, int64_t line, int64_t column,
                                                          char *err, size_t errlen, const char *fmt, ...) {
    char where[1100], message[1024]; /* a path as long as ddp_data's, and the position */
    if (column > 0)
        snprintf(where, sizeof where, "%s:%lld:%lld", r->path, (long long)line, (long long)column);
    else
        snprintf(where, sizeof where, "%s:%lld", r->path, (long long)line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return data_fail(err, errlen, where, "%s", message);
}

/* ----------------------------------------------------------------- fields */

static void advance(csv_reader *r) {
    if (*r->p == '\n') {
        r->line++;
        r->column = 1;
    } else if (((unsigned char)*r->p & 0xC0) != 0x80) { /* not a UTF-8 continuation byte */
        r->column++;
    }
    r->p++;
}

static bool at_line_end(const csv_reader *r) {
    return r->p == r->end || *r->p == '\n' || (*r->p == '\r' && r->p + 1 < r->end && r->p[1] == '\n');
}

/* Reads a field, quoted or not, leaving p on the comma, the line end or the end. */
static bool read_field(csv_reader *r, csv_field *f, char *err, size_t errlen) {
    *f = (csv_field){r->p, r->line, r->column};
    if (r->p == r->end || *r->p != '"') {
        while (r->p != r->end && *r->p != ',' && !at_line_end(r))
            advance(r);
        return true;
    }
    advance(r);
    char *out = f->text;
    for (;;) {
        if (r->p == r->end)
            return fail_at(r, f->line, f->column, err, errlen,
                           "a quoted field is not closed; add the closing "
                           "quote (a quote inside a quoted field is written twice: \"\")");
        if (*r->p == '"' && !(r->p + 1 < r->end && r->p[1] == '"'))
            break;
        if (*r->p == '"')
            advance(r); /* the first of a doubled quote */
        *out++ = *r->p;
        advance(r);
    }
    advance(r);
    if (r->p != r->end && *r->p != ',' && !at_line_end(r))
        return fail_at(r, r->line, r->column, err, errlen,
                       "text after the closing quote of a field; a quote "
                       "inside a quoted field is written twice (\"\")");
    *out = '\0'; /* out lags behind what was read, so this overwrites nothing still to read */
    return true;
}

/* Ends the field that stops at p, and steps over the comma or line end after it;
 * false when that ended the record. */
static bool end_field(csv_reader *r, char *field_end) {
    bool more = r->p != r->end && *r->p == ',';
    if (r->p != r->end && *r->p == '\r')
        advance(r);
    if (r->p != r->end)
        advance(r);
    if (field_end)
        *field_end = '\0';
    return more;
}

static bool add_field(csv_record *rec, const csv_field *f) {
    if (rec->count == rec->capacity) {
        int64_t capacity = rec->capacity ? rec->capacity * 2 : 16;
        csv_field *grown = realloc(rec->fields, (size_t)capacity * sizeof *grown);
        if (!grown)
            return false;
        rec->fields = grown;
        rec->capacity = capacity;
    }
    rec->fields[rec->count++] = *f;
    return true;
}

static bool only_blank_lines(const char *p, const char *end) {
    for (; p != end; p++)
        if (*p != '\n' && *p != '\r')
            return false;
    return true;
}

/* The next record: 1, 0 at the end of the data, -1 on an error. */
static int read_record(csv_reader *r, csv_record *rec, char *err, size_t errlen) {
    /* only a blank line's run is scanned, so this stays linear */
    if (r->p == r->end || ((*r->p == '\n' || *r->p == '\r') && only_blank_lines(r->p, r->end)))
        return 0;
    rec->count = 0;
    rec->line = r->line;
    for (;;) {
        csv_field f;
        if (!read_field(r, &f, err, errlen))
            return -1;
        char *field_end = r->p;
        if (!add_field(rec, &f))
            return data_fail(err, errlen, r->path, "out of memory"), -1;
        if (!end_field(r, field_end))
            return 1;
    }
}

/* ---------------------------------------------------------------- columns */

static const char *trimmed(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    return s;
}

/* Levenshtein distance, for "did you mean"; names too long to be typos count as far. */
static size_t edit_distance(const char *a, const char *b) {
    enum { LONGEST = 64 };
    size_t n = strlen(a), m = strlen(b), row[LONGEST + 1];
    if (n > LONGEST || m > LONGEST)
        return SIZE_MAX;
    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t above = row[j];
            size_t best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best)
                best = above + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[m];
}

static bool no_such_column(const csv_reader *r, const ddp_dataset *spec, const csv_record *header,
                           const char *name, const char *role, char *err, size_t errlen) {
    char names[512] = "", owner[160] = "";
    const char *closest = NULL;
    size_t used = 0, best = strlen(name) / 3 + 1;
    for (int64_t i = 0; i < header->count; i++) {
        const char *column = header->fields[i].text;
        int n = snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", column);
        used = n < 0 || used + (size_t)n >= sizeof names ? sizeof names - 1 : used + (size_t)n;
        size_t distance = edit_distance(name, column);
        if (distance < best) {
            best = distance;
            closest = column;
        }
    }
    char hint[160];
    if (closest)
        snprintf(hint, sizeof hint, "did you mean `%s`?", closest);
    else
        snprintf(hint, sizeof hint, "name one of them");
    if (spec->name && *spec->name)
        snprintf(owner, sizeof owner, " of the dataset `%s`", spec->name);
    return data_fail(err, errlen, r->path, "the header has no column `%s` (%s%s); its columns are %s; %s",
                     name, role, owner, names, hint);
}

static bool find_named(const csv_reader *r, const ddp_dataset *spec, const csv_record *header,
                       const char *name, const char *role, int64_t *index, char *err, size_t errlen) {
    for (int64_t i = 0; i < header->count; i++)
        if (strcmp(header->fields[i].text, name) == 0) {
            *index = i;
            return true;
        }
    return no_such_column(r, spec, header, name, role, err, errlen);
}

static bool find_numbered(const csv_reader *r, const char *name, const char *role, int64_t width,
                          int64_t *index, char *err, size_t errlen) {
    bool digits = *name && strspn(name, "0123456789") == strlen(name) && strlen(name) < 10;
    if (!digits)
        return data_fail(err, errlen, r->path,
                         "without a header, features and target are column numbers from 0 "
                         "(\"0\", \"3\"), not \"%s\"; give numbers, or header = true if the first line names "
                         "the columns",
                         name);
    *index = atol(name);
    if (*index >= width)
        return data_fail(err, errlen, r->path,
                         "column %lld (%s) is past the end: the first row has %lld fields, "
                         "columns 0..%lld; count the columns from 0",
                         (long long)*index, role, (long long)width, (long long)(width - 1));
    return true;
}

/* Which fields the features and the target are; with a header, their names. */
static bool choose_columns(const csv_reader *r, const ddp_dataset *spec, csv_record *first, csv_columns *c,
                           char *err, size_t errlen) {
    c->width = first->count;
    if (spec->header)
        for (int64_t i = 0; i < first->count; i++)
            first->fields[i].text = (char *)trimmed(first->fields[i].text);
    for (int64_t k = 0; k < c->count; k++) {
        bool target = k == c->count - 1;
        const char *name = target ? spec->target : spec->features[k];
        const char *role = target ? "the target" : "a feature";
        if (!name)
            return data_fail(err, errlen, r->path, "the dataset names no target column; name it in target");
        bool found = spec->header ? find_named(r, spec, first, name, role, &c->index[k], err, errlen)
                                  : find_numbered(r, name, role, c->width, &c->index[k], err, errlen);
        if (!found)
            return false;
        c->name[k] = spec->header ? first->fields[c->index[k]].text : NULL;
    }
    return true;
}

/* ------------------------------------------------------------------ cells */

static const char cell_hint[] =
    "every feature and target cell must hold a number: fix the cell or drop the row";

/* cell: the field's text from its first non-blank character */
static bool bad_cell(const csv_reader *r, const csv_columns *c, int64_t k, const csv_field *f,
                     const char *cell, const char *why, char *err, size_t errlen) {
    char column[160];
    if (c->name[k])
        snprintf(column, sizeof column, "`%s`", c->name[k]);
    else
        snprintf(column, sizeof column, "%lld", (long long)c->index[k]);
    if (!*cell)
        return fail_at(r, f->line, f->column, err, errlen, "the cell of column %s is empty; %s", column,
                       cell_hint);
    char quoted[48];
    return fail_at(r, f->line, f->column, err, errlen, "the cell of column %s is \"%s\", %s; %s", column,
                   data_excerpt(quoted, sizeof quoted, cell, strlen(cell)), why, cell_hint);
}

static bool parse_cell(const csv_reader *r, const csv_columns *c, int64_t k, const csv_field *f, double *out,
                       char *err, size_t errlen) {
    const char *cell = f->text;
    while (*cell == ' ' || *cell == '\t')
        cell++;
    char *end;
    double v = strtod(cell, &end);
    while (*end == ' ' || *end == '\t')
        end++;
    if (end == cell || *end)
        return bad_cell(r, c, k, f, cell, "not a number", err, errlen);
    if (!isfinite(v))
        return bad_cell(r, c, k, f, cell, "not a finite number", err, errlen);
    *out = v;
    return true;
}

static bool add_row(ddp_data *d, const csv_reader *r, const csv_record *rec, const csv_columns *c, char *err,
                    size_t errlen) {
    if (rec->count != c->width)
        return fail_at(r, rec->line, 0, err, errlen,
                       "the row has %lld fields, but the %s has %lld; fix the row (a "
                       "field holding a comma must be in double quotes)",
                       (long long)rec->count, d->spec->header ? "header" : "first row", (long long)c->width);
    double *inputs = (double *)d->inputs + d->samples * (c->count - 1);
    for (int64_t k = 0; k < c->count; k++) {
        double *out = k < c->count - 1 ? &inputs[k] : &d->labels[d->samples];
        if (!parse_cell(r, c, k, &rec->fields[c->index[k]], out, err, errlen))
            return false;
    }
    d->samples++;
    return true;
}

/* ------------------------------------------------------------------- file */

/* The most records the text can hold: one per line end, and one after the last. */
static int64_t most_records(const char *p, const char *end) {
    int64_t lines = 1;
    while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL)
        lines++, p++;
    return lines;
}

static bool read_rows(ddp_data *d, csv_reader *r, const csv_columns *c, csv_record *rec, bool first_is_data,
                      char *err, size_t errlen) {
    int64_t rows = most_records(r->p, r->end) + first_is_data;
    d->inputs = malloc((size_t)rows * (size_t)(c->count - 1) * sizeof(double));
    d->labels = malloc((size_t)rows * sizeof(double));
    if (!d->inputs || !d->labels)
        return data_fail(err, errlen, r->path, "out of memory for %lld rows", (long long)rows);
    if (first_is_data && !add_row(d, r, rec, c, err, errlen))
        return false;
    int got;
    while ((got = read_record(r, rec, err, errlen)) > 0)
        if (!add_row(d, r, rec, c, err, errlen))
            return false;
    if (got < 0)
        return false;
    if (d->samples == 0)
        return data_fail(err, errlen, r->path, "has a header but no rows of data; check the file");
    return true;
}

static bool read_table(ddp_data *d, data_bytes *b, char *err, size_t errlen) {
    const ddp_dataset *spec = d->spec;
    csv_reader r = {d->where, (char *)b->data, (char *)b->data + b->len, 1, 1};
    csv_record rec = {0};
    csv_columns c = {.count = spec->nfeatures + 1};
    c.index = calloc((size_t)c.count, sizeof *c.index);
    c.name = calloc((size_t)c.count, sizeof *c.name);
    bool ok = false;
    int got;
    if (!c.index || !c.name)
        data_fail(err, errlen, d->where, "out of memory");
    else if ((got = read_record(&r, &rec, err, errlen)) == 0)
        data_fail(err, errlen, d->where, "holds only blank lines; check the file");
    else if (got > 0)
        ok = choose_columns(&r, spec, &rec, &c, err, errlen) &&
             read_rows(d, &r, &c, &rec, !spec->header, err, errlen);
    if (ok) {
        int64_t shape[1] = {spec->nfeatures};
        data_set_sample_shape(d, 1, shape);
        d->elem = DDP_ELEM_F64;
        d->label_elems = 1;
    }
    free(rec.fields);
    free(c.index);
    free(c.name);
    return ok;
}

bool data_read_csv(ddp_data *d, char *err, size_t errlen) {
    if (d->spec->nfeatures < 1)
        return data_fail(err, errlen, d->where,
                         "the dataset names no feature columns; list them in features");
    data_bytes b;
    if (!data_read_file(d->where, d->spec, "CSV file", &b, err, errlen))
        return false;
    bool ok = read_table(d, &b, err, errlen);
    data_bytes_free(&b);
    return ok;
}
