/* lexer.re: the tokens of .ddp source, for the re2c lexer generator.
 *
 * The whole file is in memory, NUL-terminated, so the lexer uses the sentinel method
 * (no refilling): a NUL is the end of input when it is the last byte, and a stray
 * character otherwise. Newlines are white space. A number followed on the same line by
 * epochs/epoch/steps/step is one DURATION token (`5 epochs`), so `step(...)` stays
 * free as a schedule's name. Numbers may group digits with `_` (60_000). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddpc.h"
#include "parser.h"

typedef struct Lexer {
    Ddpc *c;
    SourceFile *f;
    const unsigned char *base;
    /* position tracking: tokens arrive in order, so lines and columns are counted
     * incrementally from the previous token */
    const unsigned char *scan, *line_start, *col_pos;
    int line, col;
} Lexer;

static Loc loc_at(Lexer *lx, const unsigned char *start, const unsigned char *end) {
    for (; lx->scan < start; lx->scan++)
        if (*lx->scan == '\n') {
            lx->line++;
            lx->line_start = lx->col_pos = lx->scan + 1;
            lx->col = 1;
        }
    for (; lx->col_pos < start; lx->col_pos++)
        if ((*lx->col_pos & 0xc0) != 0x80)
            lx->col++;
    Loc loc = {lx->f, (uint32_t)(start - lx->base), (uint32_t)(end - start), lx->line, lx->col};
    return loc;
}

static Token *emit(Lexer *lx, TokenList *out, int kind, const unsigned char *start,
                   const unsigned char *end) {
    Token t = {0};
    t.kind = kind;
    t.loc = loc_at(lx, start, end);
    t.text = (const char *)start;
    if (kind == TK_NAME || (*start >= 'a' && *start <= 'z')) /* names, keywords */
        t.str = arena_strndup(lx->c->arena, (const char *)start, (size_t)(end - start));
    vec_push(lx->c->arena, out, t);
    return &out->items[out->len - 1];
}

/* Parses the digits of a number token (without its unit), checking its range. */
static double number_value(Lexer *lx, const unsigned char *start, const unsigned char *end,
                           Loc loc) {
    char buf[512];
    size_t n = 0;
    bool integer = true;
    for (const unsigned char *p = start; p < end && n + 1 < sizeof buf; p++) {
        if (*p == '_')
            continue;
        if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' ||
              *p == '-'))
            break;
        if (*p == '.' || *p == 'e' || *p == 'E')
            integer = false;
        buf[n++] = (char)*p;
    }
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (!isfinite(v) || (integer && v > 9007199254740992.0)) {
        diag_report(lx->c, E_NUMBER_RANGE, loc,
                    "the number `%.*s` is too large to be represented exactly (the limit is 2^53)",
                    (int)(end - start), (const char *)start);
        return 0;
    }
    return v;
}

static void decode_string(Lexer *lx, Token *t, const unsigned char *start,
                          const unsigned char *end) {
    char *s = arena_alloc(lx->c->arena, (size_t)(end - start) + 1), *o = s;
    for (const unsigned char *p = start + 1; p < end - 1; p++) {
        if (*p != '\\') {
            *o++ = (char)*p;
            continue;
        }
        p++;
        switch (*p) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        default: {
            Loc at = t->loc;
            at.off = (uint32_t)(p - 1 - lx->base);
            at.col += (int)(p - 1 - start);
            at.len = 2;
            diag_report(lx->c, E_BAD_ESCAPE, at, "unknown escape `\\%c` in a string", *p);
            diag_note(lx->c, at, "a string may hold \\\", \\\\, \\n and \\t");
            *o++ = (char)*p;
        }
        }
    }
    *o = '\0';
    t->str = s;
}

static bool is_junk(const unsigned char *p, const unsigned char *limit) {
    return *p >= 0x80 || (*p < 0x20 && *p != '\t' && *p != '\n' && *p != '\r' &&
                          (*p != 0 || p < limit));
}

/* Reports a character that starts no token, taking a run of binary bytes as one. */
static const unsigned char *bad_character(Lexer *lx, const unsigned char *tok,
                                          const unsigned char *limit) {
    const unsigned char *end = tok + 1;
    if (is_junk(tok, limit))
        while (end < limit && is_junk(end, limit) && end - tok < 4096)
            end++;
    Loc loc = loc_at(lx, tok, end);
    size_t n = (size_t)(end - tok);
    int utf8_len = (*tok & 0xe0) == 0xc0 ? 2 : (*tok & 0xf0) == 0xe0 ? 3 : (*tok & 0xf8) == 0xf0 ? 4 : 0;
    bool one_utf8 = utf8_len > 0 && n == (size_t)utf8_len;
    for (int i = 1; one_utf8 && i < utf8_len; i++)
        one_utf8 = (tok[i] & 0xc0) == 0x80;
    if (*tok >= 0x20 && *tok < 0x7f) {
        diag_report(lx->c, E_BAD_CHARACTER, loc, "unexpected character `%c`", *tok);
        if (*tok == '\'')
            diag_note(lx->c, loc, "strings are written in double quotes: \"...\"");
        else if (*tok == ';')
            diag_note(lx->c, loc, "statements need no `;`: a statement ends where the next begins");
    } else if (one_utf8) {
        diag_report(lx->c, E_BAD_CHARACTER, loc,
                    "unexpected character `%.*s`: names and operators are ASCII", (int)n, tok);
    } else if (n > 1) {
        diag_report(lx->c, E_BAD_CHARACTER, loc,
                    "unexpected byte 0x%02x and %zu more that are not source text", *tok, n - 1);
    } else {
        diag_report(lx->c, E_BAD_CHARACTER, loc, "unexpected byte 0x%02x", *tok);
    }
    return end;
}

void lex_file(Ddpc *c, SourceFile *f, TokenList *out) {
    Lexer lx = {c, f, (const unsigned char *)f->text, NULL, NULL, NULL, 1, 1};
    lx.scan = lx.line_start = lx.col_pos = lx.base;
    const unsigned char *cur = lx.base, *limit = lx.base + f->len;
    const unsigned char *mar = cur, *tok;
    for (;;) {
        if (c->diag.stopped) {
            emit(&lx, out, 0, limit, limit);
            return;
        }
        tok = cur;
#define TOKEN(kind) { emit(&lx, out, kind, tok, cur); continue; }
        /*!re2c
        re2c:define:YYCTYPE = "unsigned char";
        re2c:define:YYCURSOR = cur;
        re2c:define:YYMARKER = mar;
        re2c:yyfill:enable = 0;

        digits = [0-9] ("_"? [0-9])*;
        number = (digits ("." digits)? | "." digits) ([eE] [+-]? digits)?;
        unit   = "epochs" | "epoch" | "steps" | "step";
        name   = [a-zA-Z_] [a-zA-Z0-9_]*;
        strch  = [^"\\\n\x00] | "\\" [^\n\x00];

        "\x00" {
            if (tok == limit) {
                emit(&lx, out, 0, tok, tok);
                return;
            }
            cur = bad_character(&lx, tok, limit);
            continue;
        }
        [ \t\r\n\v\f]+      { continue; }
        "#" [^\n\x00]*      { continue; }

        number [ \t]* unit / [^a-zA-Z0-9_] {
            Token *t = emit(&lx, out, TK_DURATION, tok, cur);
            const unsigned char *word = cur;
            while (word[-1] >= 'a' && word[-1] <= 'z')
                word--;
            const unsigned char *digits_end = word;
            while (digits_end[-1] == ' ' || digits_end[-1] == '\t')
                digits_end--;
            t->num = number_value(&lx, tok, digits_end, t->loc);
            t->unit = word[0] == 'e' ? UNIT_EPOCHS : UNIT_STEPS;
            continue;
        }
        number {
            Token *t = emit(&lx, out, TK_NUMBER, tok, cur);
            t->num = number_value(&lx, tok, cur, t->loc);
            continue;
        }
        number [a-zA-Z0-9_.]+ {
            Loc loc = loc_at(&lx, tok, cur);
            diag_report(c, E_BAD_NUMBER, loc, "malformed number `%.*s`", (int)(cur - tok),
                        (const char *)tok);
            continue;
        }

        "import"   { TOKEN(TK_IMPORT); }
        "dataset"  { TOKEN(TK_DATASET); }
        "model"    { TOKEN(TK_MODEL); }
        "block"    { TOKEN(TK_BLOCK); }
        "strategy" { TOKEN(TK_STRATEGY); }
        "train"    { TOKEN(TK_TRAIN); }
        "on"       { TOKEN(TK_ON); }
        "let"      { TOKEN(TK_LET); }
        "in"       { TOKEN(TK_IN); }
        "if"       { TOKEN(TK_IF); }
        "else"     { TOKEN(TK_ELSE); }
        "repeat"   { TOKEN(TK_REPEAT); }
        "as"       { TOKEN(TK_AS); }
        "true"     { TOKEN(TK_TRUE); }
        "false"    { TOKEN(TK_FALSE); }
        "and"      { TOKEN(TK_AND); }
        "or"       { TOKEN(TK_OR); }
        "not"      { TOKEN(TK_NOT); }
        name       { TOKEN(TK_NAME); }

        ["] strch* ["] {
            Token *t = emit(&lx, out, TK_STRING, tok, cur);
            decode_string(&lx, t, tok, cur);
            continue;
        }
        ["] strch* {
            Loc loc = loc_at(&lx, tok, tok + 1);
            diag_report(c, E_UNTERMINATED_STRING, loc, "this string has no closing quote");
            diag_note(c, loc, "a string ends on the line it starts");
            continue;
        }

        "->" { TOKEN(TK_ARROW); }
        "==" { TOKEN(TK_EQ); }
        "!=" { TOKEN(TK_NE); }
        "<=" { TOKEN(TK_LE); }
        ">=" { TOKEN(TK_GE); }
        "<"  { TOKEN(TK_LT); }
        ">"  { TOKEN(TK_GT); }
        "="  { TOKEN(TK_ASSIGN); }
        "("  { TOKEN(TK_LPAREN); }
        ")"  { TOKEN(TK_RPAREN); }
        "["  { TOKEN(TK_LBRACKET); }
        "]"  { TOKEN(TK_RBRACKET); }
        "{"  { TOKEN(TK_LBRACE); }
        "}"  { TOKEN(TK_RBRACE); }
        ","  { TOKEN(TK_COMMA); }
        ":"  { TOKEN(TK_COLON); }
        "|"  { TOKEN(TK_PIPE); }
        "+"  { TOKEN(TK_PLUS); }
        "-"  { TOKEN(TK_MINUS); }
        "*"  { TOKEN(TK_STAR); }
        "/"  { TOKEN(TK_SLASH); }

        * { cur = bad_character(&lx, tok, limit); continue; }
        */
#undef TOKEN
    }
}

/* ------------------------------------------------------------ token names */

static const struct {
    int kind;
    const char *name;  /* for --stage=tokens */
    const char *shown; /* in messages */
} token_names[] = {
    {0, "EOF", "end of file"},
    {TK_IMPORT, "IMPORT", "`import`"}, {TK_DATASET, "DATASET", "`dataset`"},
    {TK_MODEL, "MODEL", "`model`"}, {TK_BLOCK, "BLOCK", "`block`"},
    {TK_STRATEGY, "STRATEGY", "`strategy`"}, {TK_TRAIN, "TRAIN", "`train`"},
    {TK_ON, "ON", "`on`"}, {TK_LET, "LET", "`let`"}, {TK_IN, "IN", "`in`"},
    {TK_IF, "IF", "`if`"}, {TK_ELSE, "ELSE", "`else`"}, {TK_REPEAT, "REPEAT", "`repeat`"},
    {TK_AS, "AS", "`as`"}, {TK_TRUE, "TRUE", "`true`"}, {TK_FALSE, "FALSE", "`false`"},
    {TK_AND, "AND", "`and`"}, {TK_OR, "OR", "`or`"}, {TK_NOT, "NOT", "`not`"},
    {TK_NAME, "NAME", "a name"}, {TK_NUMBER, "NUMBER", "a number"},
    {TK_DURATION, "DURATION", "a duration"}, {TK_STRING, "STRING", "a string"},
    {TK_ARROW, "ARROW", "`->`"}, {TK_EQ, "EQ", "`==`"}, {TK_NE, "NE", "`!=`"},
    {TK_LE, "LE", "`<=`"}, {TK_GE, "GE", "`>=`"}, {TK_LT, "LT", "`<`"}, {TK_GT, "GT", "`>`"},
    {TK_ASSIGN, "ASSIGN", "`=`"}, {TK_LPAREN, "LPAREN", "`(`"}, {TK_RPAREN, "RPAREN", "`)`"},
    {TK_LBRACKET, "LBRACKET", "`[`"}, {TK_RBRACKET, "RBRACKET", "`]`"},
    {TK_LBRACE, "LBRACE", "`{`"}, {TK_RBRACE, "RBRACE", "`}`"}, {TK_COMMA, "COMMA", "`,`"},
    {TK_COLON, "COLON", "`:`"}, {TK_PIPE, "PIPE", "`|`"}, {TK_PLUS, "PLUS", "`+`"},
    {TK_MINUS, "MINUS", "`-`"}, {TK_STAR, "STAR", "`*`"}, {TK_SLASH, "SLASH", "`/`"},
};

static int token_index(int kind) {
    for (size_t i = 0; i < sizeof token_names / sizeof token_names[0]; i++)
        if (token_names[i].kind == kind)
            return (int)i;
    return -1;
}

const char *token_kind_name(int kind) {
    int i = token_index(kind);
    return i < 0 ? "?" : token_names[i].name;
}

const char *token_shown(int kind) {
    int i = token_index(kind);
    return i < 0 ? "?" : token_names[i].shown;
}

const char *token_describe(Ddpc *c, const Token *t) {
    switch (t->kind) {
    case TK_NAME:
        return arena_printf(c->arena, "the name `%s`", t->str);
    case TK_NUMBER:
    case TK_DURATION:
        return arena_printf(c->arena, "the number `%.*s`", (int)t->loc.len, t->text);
    case TK_STRING:
        return t->loc.len > 40 ? "a string"
                               : arena_printf(c->arena, "the string %.*s", (int)t->loc.len, t->text);
    default:
        return token_shown(t->kind);
    }
}
