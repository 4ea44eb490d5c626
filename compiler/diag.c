/* diag.c: diagnostics in GCC's form, with the source line and a caret.
 *
 *   fashion.ddp:17:10: error: dense needs ... [wrong-rank]
 *      17 |     fc1: dense(1024, activation = relu)
 *         |          ^~~~~
 *
 * Every message carries its catalogue name (diagnostics.def). The same message at the
 * same place is printed once, however many times a block is expanded; after the error
 * limit the compiler stops reporting and the passes wind down. */
#include "ddpc.h"

#include <string.h>

const DiagInfo diag_catalogue[DIAG_COUNT] = {
#define DIAG(id, sev, name, summary) [id] = {sev, name, summary},
#include "diagnostics.def"
#undef DIAG
};

DiagId diag_by_name(const char *name) {
    for (int i = 0; i < DIAG_COUNT; i++)
        if (strcmp(diag_catalogue[i].name, name) == 0)
            return (DiagId)i;
    return DIAG_COUNT;
}

enum { MAX_SHOWN_LINE = 160, MAX_SHOWN_FRAMES = 8, MAX_SCAN = MAX_SHOWN_LINE };

static const char *color(Ddpc *c, const char *code) {
    return c->diag.color ? code : "";
}

/* Prints the source line holding loc and a caret line under it. Long lines are cut to
 * a window around the caret; control bytes are shown as '?'. */
static void show_source_line(Ddpc *c, Loc loc) {
    FILE *out = c->diag.out;
    SourceFile *f = loc.file;
    if (!f || loc.off > f->len)
        return;
    /* look for the line's ends only so far: a diagnostic on a megabyte-long line
     * costs no more than one on a short one */
    size_t start = loc.off, end = loc.off;
    while (start > 0 && f->text[start - 1] != '\n' && loc.off - start < MAX_SCAN)
        start--;
    while (end < f->len && f->text[end] != '\n' && end - loc.off < MAX_SCAN)
        end++;
    size_t from = start, to = end;
    if (end - start > MAX_SHOWN_LINE) {
        from = loc.off > start + MAX_SHOWN_LINE / 2 ? loc.off - MAX_SHOWN_LINE / 2 : start;
        to = from + MAX_SHOWN_LINE < end ? from + MAX_SHOWN_LINE : end;
    }
    fprintf(out, "%5d | %s", loc.line, from > start ? "..." : "");
    for (size_t i = from; i < to; i++) {
        unsigned char ch = (unsigned char)f->text[i];
        fputc(ch == '\t' || ch >= 0x20 ? (ch == 0x7f ? '?' : ch) : '?', out);
    }
    fprintf(out, "%s\n", to < end ? "..." : "");
    fprintf(out, "%5s | %s", "", from > start ? "   " : "");
    for (size_t i = from; i < loc.off && i < to; i++) {
        unsigned char ch = (unsigned char)f->text[i];
        if (ch >= 0x80 && ch < 0xc0)
            continue; /* a UTF-8 continuation byte takes no column */
        fputc(ch == '\t' ? '\t' : ' ', out);
    }
    fprintf(out, "%s^", color(c, "\033[1;32m"));
    size_t len = loc.len ? loc.len : 1;
    for (size_t i = loc.off + 1; i < loc.off + len && i < to; i++) {
        unsigned char ch = (unsigned char)f->text[i];
        if (!(ch >= 0x80 && ch < 0xc0))
            fputc('~', out);
    }
    fprintf(out, "%s\n", color(c, "\033[0m"));
}

static void print_head(Ddpc *c, Loc loc, Severity sev) {
    static const char *const names[] = {"error", "warning", "note"};
    static const char *const colors[] = {"\033[1;31m", "\033[1;35m", "\033[1;36m"};
    FILE *out = c->diag.out;
    if (loc.file)
        fprintf(out, "%s%s:%d:%d:%s ", color(c, "\033[1m"), loc.file->path, loc.line, loc.col,
                color(c, "\033[0m"));
    else
        fprintf(out, "%sddpc:%s ", color(c, "\033[1m"), color(c, "\033[0m"));
    fprintf(out, "%s%s:%s ", color(c, colors[sev]), names[sev], color(c, "\033[0m"));
}

static bool already_seen(Ddpc *c, DiagId id, Loc loc, const char *msg) {
    const char *key = arena_printf(c->arena, "%s:%u:%d:%s", loc.file ? loc.file->realpath : "",
                                   loc.off, (int)id, msg);
    if (map_get(&c->diag.seen, key))
        return true;
    map_put(c->arena, &c->diag.seen, key, (void *)1);
    return false;
}

/* Where the block that holds an error was used, innermost first; printed after the
 * error's own notes. A deep stack shows its two ends. */
static void print_expansion(Ddpc *c) {
    Diag *d = &c->diag;
    int depth = d->pending_frames.len;
    for (int i = 0; i < depth; i++) {
        if (depth > MAX_SHOWN_FRAMES && i == MAX_SHOWN_FRAMES / 2)
            fprintf(d->out, "%snote:%s (%d more blocks in between)\n", color(c, "\033[1;36m"),
                    color(c, "\033[0m"), depth - MAX_SHOWN_FRAMES);
        if (depth > MAX_SHOWN_FRAMES && i >= MAX_SHOWN_FRAMES / 2 && i < depth - MAX_SHOWN_FRAMES / 2)
            continue;
        ExpansionFrame *f = &d->pending_frames.items[i];
        print_head(c, f->at, SEV_NOTE);
        fprintf(d->out, "in %s, used here\n", f->what);
        show_source_line(c, f->at);
    }
    d->pending_frames.len = 0;
}

void diag_flush(Ddpc *c) {
    print_expansion(c);
    fflush(c->diag.out);
}

void diag_report(Ddpc *c, DiagId id, Loc loc, const char *fmt, ...) {
    Diag *d = &c->diag;
    print_expansion(c);
    d->last_shown = false;
    Severity sev = diag_catalogue[id].sev;
    if (sev == SEV_WARNING && (d->warnings_off || d->disabled[id]))
        return;
    if (d->stopped) {
        if (!d->quiet && !d->stop_reported && (sev == SEV_ERROR || d->warnings_as_errors))
            fprintf(d->out, "ddpc: too many errors (limit %d, see --max-errors); stopping\n",
                    d->max_errors);
        d->stop_reported = true;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = arena_alloc(c->arena, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)n + 1, fmt, ap);
    va_end(ap);
    if (already_seen(c, id, loc, msg))
        return;
    if (sev == SEV_WARNING && d->warnings_as_errors)
        sev = SEV_ERROR;
    d->hits[id]++;
    if (sev == SEV_ERROR)
        d->errors++;
    else
        d->warnings++;
    d->last_shown = !d->quiet;
    d->last_loc = loc;
    if (sev == SEV_ERROR && d->max_errors > 0 && d->errors >= d->max_errors)
        d->stopped = true;
    if (d->quiet)
        return;
    print_head(c, loc, sev);
    fprintf(d->out, "%s [%s]\n", msg, diag_catalogue[id].name);
    show_source_line(c, loc);
    for (ExpansionFrame *f = d->expansion; f; f = f->outer)
        vec_push(c->arena, &d->pending_frames, *f);
}

void diag_note(Ddpc *c, Loc loc, const char *fmt, ...) {
    if (!c->diag.last_shown)
        return;
    print_head(c, loc, SEV_NOTE);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->diag.out, fmt, ap);
    va_end(ap);
    fputc('\n', c->diag.out);
    bool same_place = loc.file == c->diag.last_loc.file && loc.off == c->diag.last_loc.off;
    if (loc.file && !same_place)
        show_source_line(c, loc);
}

const char *suggest(const char *name, const char *const *candidates, int n) {
    int len = (int)strlen(name);
    if (len <= 2)
        return NULL; /* every short name is close to every other */
    int limit = len <= 4 ? 1 : len <= 7 ? 2 : 3;
    const char *best = NULL;
    int best_d = limit + 1;
    for (int i = 0; i < n; i++) {
        if (!candidates[i] || strcmp(candidates[i], name) == 0)
            continue;
        int d = edit_distance(name, candidates[i], limit);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    return best;
}

void diag_did_you_mean(Ddpc *c, Loc loc, const char *name, const char *const *candidates, int n) {
    if (!c->diag.last_shown)
        return;
    const char *s = suggest(name, candidates, n);
    if (s)
        diag_note(c, loc, "did you mean `%s`?", s);
}
