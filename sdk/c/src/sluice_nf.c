/*
 * The C SDK's runtime: implements the component's `nf` exports over the
 * NF's nf_init / nf_process / nf_expired, and the helpers of sluice_nf.h.
 *
 * Ownership follows wit-bindgen's C conventions: the batch handed to
 * `process` belongs to us (freed here when the call ends), and the lists of
 * the result are malloc'd and freed by the generated post-return function.
 */
#include "sluice_nf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORDS 4u

enum pending { KEEP = 0, SET = 1, REMOVE = 2 };

struct flow_slot {
    const uint8_t *in;   /* the state handed in (points into the batch) */
    uint32_t in_len;
    uint8_t op;          /* enum pending */
    uint8_t *out;        /* malloc'd new state when op == SET */
    uint32_t out_len;
};

struct event_buf {
    sluice_nf_types_event_t *ptr;
    size_t len, cap;
};

struct sluice_batch {
    /* the batch frame (sluice:nf@0.6.0) and its parts */
    network_function_list_u8_t *frame;
    const uint8_t *data;
    size_t data_len;
    const uint8_t *desc; /* WORDS little-endian u64s a packet */
    const uint8_t *states;
    size_t states_len;
    uint32_t n;
    uint32_t *verdicts;
    uint8_t **rewrites; /* per packet, NULL unless rewritten */
    struct flow_slot *flows;
    uint32_t nflows;
    struct event_buf events;
    /* offload requests (their rewrites malloc'd), sent when nf_process
     * returns, and the returns of ended entries, taken at most once */
    sluice_nf_offload_offload_request_t *offloads;
    size_t noffloads, offcap;
    sluice_nf_offload_list_offload_return_t returns;
    bool returns_taken;
};

bool sluice_fail(sluice_error_t *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

static void set_string(network_function_string_t *s, const char *text) {
    size_t len = strlen(text);
    s->ptr = malloc(len ? len : 1);
    s->len = s->ptr ? len : 0;
    if (s->ptr && len) memcpy(s->ptr, text, len);
}

/* ---- config ---------------------------------------------------------------- */

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

const char *sluice_config_get(const uint8_t *config, size_t config_len, const char *key, size_t *len) {
    const char *p = (const char *)config, *end = p + config_len;
    size_t klen = strlen(key);
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *a = p;
        while (a < eol && is_space(*a)) a++;
        const char *eq = memchr(a, '=', (size_t)(eol - a));
        if (eq && *a != '#') {
            const char *kend = eq;
            while (kend > a && is_space(kend[-1])) kend--;
            if ((size_t)(kend - a) == klen && memcmp(a, key, klen) == 0) {
                const char *v = eq + 1, *vend = eol;
                while (v < vend && is_space(*v)) v++;
                while (vend > v && is_space(vend[-1])) vend--;
                *len = (size_t)(vend - v);
                return v;
            }
        }
        p = eol + 1;
    }
    *len = 0;
    return NULL;
}

static bool config_digits(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

bool sluice_config_int(const uint8_t *config, size_t config_len, const char *key, int64_t def, int64_t *out,
                       sluice_error_t *err) {
    size_t len;
    const char *v = sluice_config_get(config, config_len, key, &len);
    if (!v) {
        *out = def;
        return true;
    }
    size_t at = 0;
    bool neg = false;
    if (len && (v[0] == '+' || v[0] == '-')) neg = v[at++] == '-';
    if (at == len || !config_digits(v + at, len - at))
        return sluice_fail(err, "%s = %.*s: not an integer", key, (int)len, v);
    /* 2^63 - 1, or 2^63 for a negative value. */
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, n = 0;
    for (; at < len; at++) {
        uint64_t d = (uint64_t)(v[at] - '0');
        if (n > (limit - d) / 10) return sluice_fail(err, "%s = %.*s: integer out of range", key, (int)len, v);
        n = n * 10 + d;
    }
    *out = neg ? (n == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)n) : (int64_t)n;
    return true;
}

/* [+-]?(digits[.digits?]|.digits)([eE][+-]?digits)?: the float syntax
 * every SDK accepts. */
static bool config_decimal_float(const char *v, size_t len) {
    size_t at = 0, int_digits = 0, frac_digits = 0;
    if (at < len && (v[at] == '+' || v[at] == '-')) at++;
    while (at < len && v[at] >= '0' && v[at] <= '9') at++, int_digits++;
    if (at < len && v[at] == '.') {
        at++;
        while (at < len && v[at] >= '0' && v[at] <= '9') at++, frac_digits++;
    }
    if (!int_digits && !frac_digits) return false;
    if (at < len && (v[at] == 'e' || v[at] == 'E')) {
        at++;
        if (at < len && (v[at] == '+' || v[at] == '-')) at++;
        size_t exp_digits = 0;
        while (at < len && v[at] >= '0' && v[at] <= '9') at++, exp_digits++;
        if (!exp_digits) return false;
    }
    return at == len;
}

bool sluice_config_float(const uint8_t *config, size_t config_len, const char *key, double def, double *out,
                         sluice_error_t *err) {
    size_t len;
    const char *v = sluice_config_get(config, config_len, key, &len);
    if (!v) {
        *out = def;
        return true;
    }
    if (!config_decimal_float(v, len)) return sluice_fail(err, "%s = %.*s: not a number", key, (int)len, v);
    char *text = malloc(len + 1);
    if (!text) return sluice_fail(err, "out of memory");
    memcpy(text, v, len);
    text[len] = 0;
    double d = strtod(text, NULL);
    free(text);
    if (!isfinite(d)) return sluice_fail(err, "%s = %.*s: not a number", key, (int)len, v);
    *out = d;
    return true;
}

static bool config_word(const char *v, size_t len, const char *word) {
    if (strlen(word) != len) return false;
    for (size_t i = 0; i < len; i++) {
        char c = v[i] >= 'A' && v[i] <= 'Z' ? (char)(v[i] - 'A' + 'a') : v[i];
        if (c != word[i]) return false;
    }
    return true;
}

bool sluice_config_bool(const uint8_t *config, size_t config_len, const char *key, bool def, bool *out,
                        sluice_error_t *err) {
    size_t len;
    const char *v = sluice_config_get(config, config_len, key, &len);
    if (!v) {
        *out = def;
        return true;
    }
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (config_word(v, len, yes[i])) return *out = true, true;
        if (config_word(v, len, no[i])) return *out = false, true;
    }
    return sluice_fail(err, "%s = %.*s: not a boolean (true/false, yes/no, on/off, 1/0)", key, (int)len, v);
}

bool sluice_config_string(const uint8_t *config, size_t config_len, const char *key, const char *def, char *out,
                          size_t out_size, sluice_error_t *err) {
    size_t len;
    const char *v = sluice_config_get(config, config_len, key, &len);
    if (!v) {
        v = def ? def : "";
        len = strlen(v);
    }
    if (!out_size || len > out_size - 1)
        return sluice_fail(err, "%s = %.*s: longer than %zu bytes", key, (int)len, v, out_size ? out_size - 1 : 0);
    memcpy(out, v, len);
    out[len] = 0;
    return true;
}

bool sluice_parse_ipv4_cidr(const char *text, size_t len, uint32_t *addr, uint32_t *mask) {
    uint32_t parts[5] = {0, 0, 0, 0, 32};
    size_t part = 0, digits = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c >= '0' && c <= '9') {
            parts[part] = parts[part] * 10 + (uint32_t)(c - '0');
            if (++digits > 3) return false;
        } else if ((c == '.' && part < 3) || (c == '/' && part == 3)) {
            if (!digits) return false;
            part++;
            digits = 0;
            if (c == '/') parts[4] = 0;
        } else {
            return false;
        }
    }
    if (!digits || part < 3) return false;
    for (int i = 0; i < 4; i++)
        if (parts[i] > 255) return false;
    if (parts[4] > 32) return false;
    *addr = parts[0] << 24 | parts[1] << 16 | parts[2] << 8 | parts[3];
    *mask = parts[4] == 0 ? 0 : 0xffffffffu << (32 - parts[4]);
    return true;
}

/* ---- packets --------------------------------------------------------------- */

uint32_t sluice_batch_len(const sluice_batch_t *b) { return b->n; }

sluice_packet_t sluice_batch_packet(const sluice_batch_t *b, uint32_t i) {
    sluice_packet_t p;
    memset(&p, 0, sizeof p);
    p.flow = SLUICE_NO_FLOW;
    p.l4_offset = 0xffff;
    p.l3_offset = 0xff;
    if (i >= b->n) return p;
    uint64_t d[WORDS];
    memcpy(d, b->desc + (size_t)i * WORDS * 8, sizeof d);
    uint32_t end = (uint32_t)d[0];
    uint32_t start = 0;
    if (i) {
        uint64_t prev;
        memcpy(&prev, b->desc + (size_t)(i - 1) * WORDS * 8, sizeof prev);
        start = (uint32_t)prev;
    }
    if (end > b->data_len || start > end) return p;
    p.data = b->data + start;
    p.len = end - start;
    p.wire_len = (uint32_t)(d[0] >> 32);
    p.timestamp_ns = d[1];
    p.flow_hash = d[2];
    p.flow = (uint32_t)(d[3] & 0xffff);
    p.ingress_port = (uint16_t)(d[3] >> 16);
    p.l4_offset = (uint16_t)(d[3] >> 32);
    p.l3_offset = (uint8_t)(d[3] >> 48);
    p.flags = (uint8_t)(d[3] >> 56);
    return p;
}

uint16_t sluice_be16(const uint8_t *data, size_t len, size_t at) {
    if (!data || at + 2 > len) return 0;
    return (uint16_t)(data[at] << 8 | data[at + 1]);
}

uint32_t sluice_be32(const uint8_t *data, size_t len, size_t at) {
    if (!data || at + 4 > len) return 0;
    return (uint32_t)data[at] << 24 | (uint32_t)data[at + 1] << 16 | (uint32_t)data[at + 2] << 8 | data[at + 3];
}

bool sluice_put_be16(uint8_t *data, size_t len, size_t at, uint16_t v) {
    if (!data || at + 2 > len) return false;
    data[at] = (uint8_t)(v >> 8);
    data[at + 1] = (uint8_t)v;
    return true;
}

/* The same acceptance rules as the host's parser and the Rust SDK: a
 * header is only read when all of it (options included) was captured. */
bool sluice_is_ipv4(const sluice_packet_t *p) {
    if (p->l3_offset == 0xff || (p->flags & SLUICE_FLAG_IPV6)) return false;
    size_t l3 = p->l3_offset;
    if (l3 + 20 > p->len || (p->data[l3] >> 4) != 4) return false;
    size_t hl = (size_t)(p->data[l3] & 0x0f) * 4;
    return hl >= 20 && l3 + hl <= p->len && sluice_be16(p->data, p->len, l3 + 2) >= hl;
}

uint8_t sluice_ip_proto(const sluice_packet_t *p) {
    if (p->l3_offset == 0xff) return 0;
    if (!(p->flags & SLUICE_FLAG_IPV6)) return sluice_is_ipv4(p) ? p->data[p->l3_offset + 9] : 0;
    size_t at = (size_t)p->l3_offset + 6;
    return at < p->len ? p->data[at] : 0;
}

uint32_t sluice_ipv4_src(const sluice_packet_t *p) {
    return sluice_is_ipv4(p) ? sluice_be32(p->data, p->len, (size_t)p->l3_offset + 12) : 0;
}

uint32_t sluice_ipv4_dst(const sluice_packet_t *p) {
    return sluice_is_ipv4(p) ? sluice_be32(p->data, p->len, (size_t)p->l3_offset + 16) : 0;
}

/* The same rule as the Rust SDK's Packet::ipv6: the IPv6 flag, the fixed
 * header captured, version 6. */
bool sluice_is_ipv6(const sluice_packet_t *p) {
    if (p->l3_offset == 0xff || !(p->flags & SLUICE_FLAG_IPV6)) return false;
    size_t l3 = p->l3_offset;
    return l3 + 40 <= p->len && (p->data[l3] >> 4) == 6;
}

static bool ipv6_address(const sluice_packet_t *p, size_t at, uint8_t out[16]) {
    if (!sluice_is_ipv6(p)) {
        memset(out, 0, 16);
        return false;
    }
    memcpy(out, p->data + p->l3_offset + at, 16);
    return true;
}

bool sluice_ipv6_src(const sluice_packet_t *p, uint8_t out[16]) { return ipv6_address(p, 8, out); }

bool sluice_ipv6_dst(const sluice_packet_t *p, uint8_t out[16]) { return ipv6_address(p, 24, out); }

bool sluice_is_tcp(const sluice_packet_t *p) {
    if (p->l4_offset == 0xffff || sluice_ip_proto(p) != 6) return false;
    size_t l4 = p->l4_offset;
    if (l4 + 20 > p->len) return false;
    size_t hl = (size_t)(p->data[l4 + 12] >> 4) * 4;
    return hl >= 20 && l4 + hl <= p->len;
}

bool sluice_is_udp(const sluice_packet_t *p) {
    return p->l4_offset != 0xffff && sluice_ip_proto(p) == 17 && (size_t)p->l4_offset + 8 <= p->len;
}

uint16_t sluice_src_port(const sluice_packet_t *p) {
    return sluice_is_tcp(p) || sluice_is_udp(p) ? sluice_be16(p->data, p->len, p->l4_offset) : 0;
}

uint16_t sluice_dst_port(const sluice_packet_t *p) {
    return sluice_is_tcp(p) || sluice_is_udp(p) ? sluice_be16(p->data, p->len, (size_t)p->l4_offset + 2) : 0;
}

uint8_t sluice_tcp_flags(const sluice_packet_t *p) {
    return sluice_is_tcp(p) ? p->data[p->l4_offset + 13] : 0;
}

uint16_t sluice_csum_update16(uint16_t sum, uint16_t old_word, uint16_t new_word) {
    uint32_t s = (uint32_t)(uint16_t)~sum + (uint32_t)(uint16_t)~old_word + new_word;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

/* ---- decisions ------------------------------------------------------------- */

void sluice_set_verdict(sluice_batch_t *b, uint32_t i, uint32_t verdict) {
    if (i < b->n) b->verdicts[i] = verdict;
}

uint32_t sluice_verdict(const sluice_batch_t *b, uint32_t i) { return i < b->n ? b->verdicts[i] : SLUICE_DROP; }

uint8_t *sluice_rewrite(sluice_batch_t *b, uint32_t i) {
    if (i >= b->n) return NULL;
    if (!b->rewrites) {
        b->rewrites = calloc(b->n, sizeof *b->rewrites);
        if (!b->rewrites) return NULL;
    }
    if (!b->rewrites[i]) {
        sluice_packet_t p = sluice_batch_packet(b, i);
        if (!p.len) return NULL;
        b->rewrites[i] = malloc(p.len);
        if (b->rewrites[i]) memcpy(b->rewrites[i], p.data, p.len);
    }
    return b->rewrites[i];
}

/* ---- flow state ------------------------------------------------------------ */

static bool index_flow_states(sluice_batch_t *b) {
    const uint8_t *s = b->states;
    size_t len = b->states_len, at = 0, n = 0;
    while (at + 4 <= len) {
        uint32_t l = (uint32_t)s[at] | (uint32_t)s[at + 1] << 8 | (uint32_t)s[at + 2] << 16 | (uint32_t)s[at + 3] << 24;
        if (l > len - at - 4) break;
        at += 4 + l;
        n++;
    }
    if (!n) return true;
    b->flows = calloc(n, sizeof *b->flows);
    if (!b->flows) return false;
    b->nflows = (uint32_t)n;
    at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)s[at] | (uint32_t)s[at + 1] << 8 | (uint32_t)s[at + 2] << 16 | (uint32_t)s[at + 3] << 24;
        b->flows[i].in = s + at + 4;
        b->flows[i].in_len = l;
        at += 4 + l;
    }
    return true;
}

const uint8_t *sluice_flow_state(const sluice_batch_t *b, uint32_t flow, uint32_t *len) {
    *len = 0;
    if (flow >= b->nflows) return NULL;
    const struct flow_slot *f = &b->flows[flow];
    switch (f->op) {
    case SET:
        *len = f->out_len;
        return f->out;
    case REMOVE:
        return NULL;
    default:
        if (!f->in_len) return NULL;
        *len = f->in_len;
        return f->in;
    }
}

bool sluice_set_flow_state(sluice_batch_t *b, uint32_t flow, const void *data, uint32_t len) {
    if (flow >= b->nflows) return false;
    if (!len) {
        sluice_remove_flow_state(b, flow);
        return true;
    }
    uint8_t *copy = malloc(len);
    if (!copy) return false;
    memcpy(copy, data, len);
    struct flow_slot *f = &b->flows[flow];
    free(f->out);
    f->out = copy;
    f->out_len = len;
    f->op = SET;
    return true;
}

void sluice_remove_flow_state(sluice_batch_t *b, uint32_t flow) {
    if (flow >= b->nflows) return;
    struct flow_slot *f = &b->flows[flow];
    free(f->out);
    f->out = NULL;
    f->out_len = 0;
    f->op = REMOVE;
}

/* ---- log and events -------------------------------------------------------- */

void sluice_log(uint8_t level, const char *message) {
    network_function_string_t s = {(uint8_t *)message, strlen(message)};
    sluice_nf_host_log_log(level, &s);
}

bool sluice_event(sluice_batch_t *b, const char *kind, uint8_t level, int64_t packet, const char *const *fields,
                  size_t nfields) {
    struct event_buf *e = &b->events;
    if (e->len == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        sluice_nf_types_event_t *p = realloc(e->ptr, cap * sizeof *p);
        if (!p) return false;
        e->ptr = p;
        e->cap = cap;
    }
    sluice_nf_types_event_t *ev = &e->ptr[e->len];
    memset(ev, 0, sizeof *ev);
    set_string(&ev->kind, kind);
    ev->level = level;
    ev->packet.is_some = packet >= 0;
    ev->packet.val = packet >= 0 ? (uint32_t)packet : 0;
    if (nfields) {
        ev->fields.ptr = calloc(nfields, sizeof *ev->fields.ptr);
        if (!ev->fields.ptr) return false;
        ev->fields.len = nfields;
        for (size_t i = 0; i < nfields; i++) {
            set_string(&ev->fields.ptr[i].f0, fields[2 * i]);
            set_string(&ev->fields.ptr[i].f1, fields[2 * i + 1]);
        }
    }
    e->len++;
    return true;
}

static void flush_events(struct event_buf *e);

bool sluice_emit(const char *kind, uint8_t level, const char *const *fields, size_t nfields) {
    sluice_batch_t scratch;
    memset(&scratch, 0, sizeof scratch);
    if (!sluice_event(&scratch, kind, level, -1, fields, nfields)) return false;
    flush_events(&scratch.events);
    return true;
}

static void flush_events(struct event_buf *e) {
    if (e->len) {
        sluice_nf_host_log_list_event_t list = {e->ptr, e->len};
        sluice_nf_host_log_emit(&list);
        for (size_t i = 0; i < e->len; i++) sluice_nf_types_event_free(&e->ptr[i]);
    }
    free(e->ptr);
    e->ptr = NULL;
    e->len = e->cap = 0;
}

/* ---- tables ---------------------------------------------------------------- */

/* Turns the contract's state-error into err: the message, the case
 * (SLUICE_STATE_ERR_*, the contract's tag plus one) and the refused item. */
static bool state_fail(sluice_error_t *err, const char *what, sluice_nf_state_state_error_t *e) {
    static const char *const names[] = {"unknown table", "not now", "wrong kind", "bad spec", "incompatible",
                                        "bad input",     "full",    "over budget", "too large"};
    const char *name = e->tag < 9 ? names[e->tag] : "unknown error";
    err->state_error = (uint8_t)(e->tag < 9 ? e->tag + 1 : 0);
    err->item = -1;
    switch (e->tag) {
    case SLUICE_NF_STATE_STATE_ERROR_BAD_SPEC:
    case SLUICE_NF_STATE_STATE_ERROR_INCOMPATIBLE: {
        network_function_string_t *m = e->tag == SLUICE_NF_STATE_STATE_ERROR_BAD_SPEC ? &e->val.bad_spec : &e->val.incompatible;
        sluice_fail(err, "%s: %s: %.*s", what, name, (int)m->len, (const char *)m->ptr);
        break;
    }
    case SLUICE_NF_STATE_STATE_ERROR_BAD_INPUT:
    case SLUICE_NF_STATE_STATE_ERROR_FULL:
    case SLUICE_NF_STATE_STATE_ERROR_OVER_BUDGET:
    case SLUICE_NF_STATE_STATE_ERROR_TOO_LARGE: {
        uint32_t item = e->tag == SLUICE_NF_STATE_STATE_ERROR_BAD_INPUT ? e->val.bad_input
                        : e->tag == SLUICE_NF_STATE_STATE_ERROR_FULL    ? e->val.full
                        : e->tag == SLUICE_NF_STATE_STATE_ERROR_OVER_BUDGET ? e->val.over_budget
                                                                            : e->val.too_large;
        err->item = item;
        sluice_fail(err, "%s: %s at item %u", what, name, (unsigned)item);
        break;
    }
    case SLUICE_NF_STATE_STATE_ERROR_UNKNOWN_TABLE:
        sluice_fail(err, "%s: %s %u", what, name, (unsigned)e->val.unknown_table);
        break;
    default:
        sluice_fail(err, "%s: %s", what, name);
    }
    sluice_nf_state_state_error_free(e);
    return false;
}

bool sluice_declare(sluice_nf_state_table_spec_t *spec, sluice_table_t *table, sluice_error_t *err) {
    sluice_nf_state_state_error_t e;
    if (sluice_nf_state_declare(spec, table, &e)) return true;
    return state_fail(err, "declaring a table", &e);
}

bool sluice_declare_sum_counter(const char *name, uint64_t merge_interval_ns, sluice_table_t *table,
                                sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_eventual_counter(&spec, name, SLUICE_MERGE_SUM, merge_interval_ns);
    return sluice_declare(&spec, table, err);
}

bool sluice_counter_add(sluice_table_t table, uint64_t *keys, int64_t *deltas, size_t n, sluice_error_t *err) {
    network_function_list_u64_t k = {keys, n};
    network_function_list_s64_t d = {deltas, n};
    sluice_nf_state_state_error_t e;
    if (sluice_nf_state_counter_add(table, &k, &d, &e)) return true;
    return state_fail(err, "counter-add", &e);
}

bool sluice_counter_get(sluice_table_t table, uint64_t *keys, uint64_t *out, size_t n, sluice_error_t *err) {
    network_function_list_u64_t k = {keys, n}, r = {0};
    sluice_nf_state_state_error_t e;
    if (!sluice_nf_state_counter_get(table, &k, &r, &e)) return state_fail(err, "counter-get", &e);
    for (size_t i = 0; i < n; i++) out[i] = i < r.len ? r.ptr[i] : 0;
    network_function_list_u64_free(&r);
    return true;
}

bool sluice_frame_push(sluice_buf_t *b, const void *item, uint32_t len) {
    if (b->len + 4 + len > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + 4 + len) cap *= 2;
        uint8_t *p = realloc(b->ptr, cap);
        if (!p) return false;
        b->ptr = p;
        b->cap = cap;
    }
    uint8_t *at = b->ptr + b->len;
    at[0] = (uint8_t)len, at[1] = (uint8_t)(len >> 8), at[2] = (uint8_t)(len >> 16), at[3] = (uint8_t)(len >> 24);
    if (len) memcpy(at + 4, item, len);
    b->len += 4 + len;
    return true;
}

void sluice_buf_free(sluice_buf_t *b) {
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

bool sluice_frame_next(const uint8_t *data, size_t len, size_t *at, const uint8_t **item, uint32_t *item_len) {
    if (*at + 4 > len) return false;
    const uint8_t *p = data + *at;
    uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (n > len - *at - 4) return false;
    *item = p + 4;
    *item_len = n;
    *at += 4 + n;
    return true;
}

/* ---- table specs ----------------------------------------------------------- */

static void base_spec(sluice_table_spec_t *spec, const char *name, uint8_t scope, uint8_t access, uint8_t kind,
                      uint32_t max_value_size) {
    memset(spec, 0, sizeof *spec);
    spec->name.ptr = (uint8_t *)name;
    spec->name.len = strlen(name);
    spec->scope = scope;
    spec->access = access;
    spec->kind = kind;
    spec->consistency.tag = SLUICE_NF_STATE_CONSISTENCY_LOCAL;
    spec->max_value_size = max_value_size;
}

void sluice_spec_per_flow_counter(sluice_table_spec_t *spec, const char *name) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_PER_FLOW, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_COUNTER, 8);
}

void sluice_spec_per_flow_bytes(sluice_table_spec_t *spec, const char *name, uint32_t max_value_size) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_PER_FLOW, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_BYTES, max_value_size);
}

void sluice_spec_read_only_counter(sluice_table_spec_t *spec, const char *name) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_ONLY,
              SLUICE_NF_STATE_VALUE_KIND_COUNTER, 8);
}

void sluice_spec_read_only_bytes(sluice_table_spec_t *spec, const char *name, uint32_t key_size,
                                 uint32_t max_value_size) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_ONLY,
              SLUICE_NF_STATE_VALUE_KIND_BYTES, max_value_size);
    spec->key_size = key_size;
}

void sluice_spec_eventual_counter(sluice_table_spec_t *spec, const char *name, uint8_t merge,
                                  uint64_t merge_interval_ns) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_COUNTER, 8);
    spec->consistency.tag = SLUICE_NF_STATE_CONSISTENCY_EVENTUAL;
    spec->consistency.val.eventual.merge = merge;
    spec->consistency.val.eventual.merge_interval_ns = merge_interval_ns;
}

void sluice_spec_single_writer_counter(sluice_table_spec_t *spec, const char *name, uint64_t sync_interval_ns) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_COUNTER, 8);
    spec->consistency.tag = SLUICE_NF_STATE_CONSISTENCY_SINGLE_WRITER;
    spec->consistency.val.single_writer.sync_interval_ns = sync_interval_ns;
}

void sluice_spec_single_writer_bytes(sluice_table_spec_t *spec, const char *name, uint32_t key_size,
                                     uint32_t max_value_size, uint64_t sync_interval_ns) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_BYTES, max_value_size);
    spec->key_size = key_size;
    spec->consistency.tag = SLUICE_NF_STATE_CONSISTENCY_SINGLE_WRITER;
    spec->consistency.val.single_writer.sync_interval_ns = sync_interval_ns;
}

void sluice_spec_pool(sluice_table_spec_t *spec, const char *name, uint64_t first, uint64_t count,
                      uint32_t max_value_size) {
    base_spec(spec, name, SLUICE_NF_STATE_SCOPE_GLOBAL, SLUICE_NF_STATE_ACCESS_READ_WRITE,
              SLUICE_NF_STATE_VALUE_KIND_BYTES, max_value_size);
    spec->consistency.tag = SLUICE_NF_STATE_CONSISTENCY_RELEASE;
    spec->consistency.val.release.first = first;
    spec->consistency.val.release.count = count;
}

bool sluice_declare_per_flow_bytes(const char *name, uint32_t max_value_size, sluice_table_t *table,
                                   sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_per_flow_bytes(&spec, name, max_value_size);
    return sluice_declare(&spec, table, err);
}

bool sluice_declare_per_flow_bytes_expiring(const char *name, uint32_t max_value_size, uint64_t idle_timeout_ns,
                                            bool notify_expired, sluice_table_t *table, sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_per_flow_bytes(&spec, name, max_value_size);
    spec.idle_timeout_ns = idle_timeout_ns;
    spec.notify_expired = notify_expired;
    return sluice_declare(&spec, table, err);
}

bool sluice_declare_pool(const char *name, uint64_t first, uint64_t count, uint32_t max_value_size,
                         sluice_table_t *table, sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_pool(&spec, name, first, count, max_value_size);
    return sluice_declare(&spec, table, err);
}

bool sluice_declare_single_writer_counter(const char *name, uint64_t sync_interval_ns, sluice_table_t *table,
                                          sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_single_writer_counter(&spec, name, sync_interval_ns);
    return sluice_declare(&spec, table, err);
}

bool sluice_declare_single_writer_bytes(const char *name, uint32_t key_size, uint32_t max_value_size,
                                        uint64_t sync_interval_ns, sluice_table_t *table, sluice_error_t *err) {
    sluice_table_spec_t spec;
    sluice_spec_single_writer_bytes(&spec, name, key_size, max_value_size, sync_interval_ns);
    return sluice_declare(&spec, table, err);
}

bool sluice_get_many(sluice_table_t table, const uint8_t *keys, size_t len, sluice_buf_t *out, sluice_error_t *err) {
    network_function_list_u8_t k = {(uint8_t *)keys, len}, r = {0};
    sluice_nf_state_state_error_t e;
    if (!sluice_nf_state_get_many(table, &k, &r, &e)) return state_fail(err, "get-many", &e);
    /* An empty list's pointer is not an allocation (free would fail). */
    out->ptr = r.len ? r.ptr : NULL, out->len = out->cap = r.len;
    return true;
}

bool sluice_put_many(sluice_table_t table, const uint8_t *entries, size_t len, sluice_error_t *err) {
    network_function_list_u8_t k = {(uint8_t *)entries, len};
    sluice_nf_state_state_error_t e;
    if (sluice_nf_state_put_many(table, &k, &e)) return true;
    return state_fail(err, "put-many", &e);
}

bool sluice_acquire(sluice_table_t table, const uint8_t *values, size_t len, uint64_t **ids, size_t *n,
                    sluice_error_t *err) {
    network_function_list_u8_t v = {(uint8_t *)values, len};
    network_function_list_u64_t r = {0};
    sluice_nf_state_state_error_t e;
    if (!sluice_nf_state_acquire(table, &v, &r, &e)) return state_fail(err, "acquire", &e);
    *ids = r.len ? r.ptr : NULL, *n = r.len;
    return true;
}

bool sluice_lookup(sluice_table_t table, uint64_t *ids, size_t n, sluice_buf_t *out, sluice_error_t *err) {
    network_function_list_u64_t k = {ids, n};
    network_function_list_u8_t r = {0};
    sluice_nf_state_state_error_t e;
    if (!sluice_nf_state_lookup(table, &k, &r, &e)) return state_fail(err, "lookup", &e);
    /* An empty list's pointer is not an allocation (free would fail). */
    out->ptr = r.len ? r.ptr : NULL, out->len = out->cap = r.len;
    return true;
}

bool sluice_release(sluice_table_t table, uint64_t *ids, size_t n, sluice_error_t *err) {
    network_function_list_u64_t k = {ids, n};
    sluice_nf_state_state_error_t e;
    if (sluice_nf_state_release(table, &k, &e)) return true;
    return state_fail(err, "release", &e);
}

_Static_assert(sizeof(sluice_counter_entry_t) == sizeof(network_function_tuple2_u64_u64_t),
               "a counter entry has the layout of the contract's tuple<u64, u64>");

bool sluice_scan(sluice_table_t table, const uint8_t *cursor, size_t cursor_len, uint32_t limit,
                 sluice_scan_page_t *page, sluice_error_t *err) {
    network_function_list_u8_t c = {(uint8_t *)cursor, cursor_len};
    sluice_nf_state_scan_page_t r;
    sluice_nf_state_state_error_t e;
    memset(page, 0, sizeof *page);
    if (!sluice_nf_state_scan(table, &c, limit, &r, &e)) return state_fail(err, "scan", &e);
    /* An empty list's pointer is not an allocation: keep NULL instead. */
    if (r.counters.len > 0) page->counters = (sluice_counter_entry_t *)r.counters.ptr, page->n_counters = r.counters.len;
    if (r.entries.len > 0) page->entries.ptr = r.entries.ptr, page->entries.len = page->entries.cap = r.entries.len;
    if (r.cursor.len > 0) page->cursor.ptr = r.cursor.ptr, page->cursor.len = page->cursor.cap = r.cursor.len;
    return true;
}

void sluice_scan_page_free(sluice_scan_page_t *page) {
    free(page->counters);
    sluice_buf_free(&page->entries);
    sluice_buf_free(&page->cursor);
    memset(page, 0, sizeof *page);
}

bool sluice_top_k(sluice_table_t table, uint32_t k, sluice_counter_entry_t *out, size_t *n, sluice_error_t *err) {
    network_function_list_tuple2_u64_u64_t r = {0};
    sluice_nf_state_state_error_t e;
    *n = 0;
    if (!sluice_nf_state_top_k(table, k, &r, &e)) return state_fail(err, "top-k", &e);
    for (size_t i = 0; i < r.len && i < k; i++) out[i] = (sluice_counter_entry_t){r.ptr[i].f0, r.ptr[i].f1};
    *n = r.len < k ? r.len : k;
    network_function_list_tuple2_u64_u64_free(&r);
    return true;
}

/* ---- the exports ----------------------------------------------------------- */

__attribute__((weak)) bool nf_expired(uint32_t table, const uint8_t *entries, size_t len, sluice_error_t *err) {
    (void)table, (void)entries, (void)len, (void)err;
    return true;
}

/* An error with no message and no state error, as each export starts. */
static void no_error(sluice_error_t *e) {
    memset(e, 0, sizeof *e);
    e->item = -1;
}

bool exports_sluice_nf_nf_init(network_function_list_u8_t *config, exports_sluice_nf_nf_nf_info_t *ret,
                               network_function_string_t *err) {
    sluice_info_t info = {false, 0};
    sluice_error_t e;
    no_error(&e);
    bool ok = nf_init(config->ptr, config->len, &info, &e);
    network_function_list_u8_free(config);
    if (!ok) {
        set_string(err, e.message[0] ? e.message : "init failed");
        return false;
    }
    ret->wants_flow_state = info.wants_flow_state;
    ret->flow_idle_timeout_ns = info.flow_idle_timeout_ns;
    return true;
}

/* ---- flow offload ------------------------------------------------------------ */

/* Whether this instance ever asked to offload with counts returned: a
 * batch the NF did not look at then takes what ended anyway, so the host
 * keeps nothing for ever. */
static bool offloaded_with_counts;

static sluice_rewrite_op_t endpoint_op(uint8_t tag, const uint8_t *address, size_t len, bool has_port, uint16_t port) {
    sluice_rewrite_op_t op;
    memset(&op, 0, sizeof op);
    op.tag = tag;
    op.val.source.address.ptr = (uint8_t *)address;
    op.val.source.address.len = len;
    op.val.source.port.is_some = has_port;
    op.val.source.port.val = port;
    return op;
}

sluice_rewrite_op_t sluice_op_source(const uint8_t *address, size_t len, bool has_port, uint16_t port) {
    return endpoint_op(SLUICE_NF_OFFLOAD_REWRITE_OP_SOURCE, address, len, has_port, port);
}

sluice_rewrite_op_t sluice_op_destination(const uint8_t *address, size_t len, bool has_port, uint16_t port) {
    return endpoint_op(SLUICE_NF_OFFLOAD_REWRITE_OP_DESTINATION, address, len, has_port, port);
}

sluice_rewrite_op_t sluice_op_decrement_ttl(void) {
    sluice_rewrite_op_t op;
    memset(&op, 0, sizeof op);
    op.tag = SLUICE_NF_OFFLOAD_REWRITE_OP_DECREMENT_TTL;
    return op;
}

sluice_rewrite_op_t sluice_op_set_dscp(uint8_t dscp) {
    sluice_rewrite_op_t op;
    memset(&op, 0, sizeof op);
    op.tag = SLUICE_NF_OFFLOAD_REWRITE_OP_SET_DSCP;
    op.val.set_dscp = dscp;
    return op;
}

bool sluice_offload(sluice_batch_t *b, uint32_t i, const sluice_offload_t *opts) {
    if (b->noffloads == b->offcap) {
        size_t cap = b->offcap ? b->offcap * 2 : 8;
        sluice_nf_offload_offload_request_t *p = realloc(b->offloads, cap * sizeof *p);
        if (!p) return false;
        b->offloads = p;
        b->offcap = cap;
    }
    sluice_nf_offload_offload_request_t *r = &b->offloads[b->noffloads];
    memset(r, 0, sizeof *r);
    r->packet = i;
    r->return_counts = true;
    if (opts) {
        if (opts->nrewrites) {
            r->rewrites.ptr = malloc(opts->nrewrites * sizeof *r->rewrites.ptr);
            if (!r->rewrites.ptr) return false;
            memcpy(r->rewrites.ptr, opts->rewrites, opts->nrewrites * sizeof *r->rewrites.ptr);
            r->rewrites.len = opts->nrewrites;
        }
        r->idle_timeout_ns = opts->idle_timeout_ns;
        r->max_packets = opts->max_packets;
        r->max_bytes = opts->max_bytes;
        r->max_age_ns = opts->max_age_ns;
        r->return_counts = !opts->without_counts;
    }
    b->noffloads++;
    return true;
}

size_t sluice_offload_now(sluice_batch_t *b, uint8_t *results) {
    size_t n = b->noffloads;
    if (!n) return 0;
    for (size_t k = 0; k < n; k++) offloaded_with_counts |= b->offloads[k].return_counts;
    sluice_nf_offload_list_offload_request_t list = {b->offloads, n};
    sluice_nf_offload_list_result_void_offload_error_t out = {NULL, 0};
    sluice_nf_offload_offload(&list, &out);
    for (size_t k = 0; k < n; k++) {
        if (results) results[k] = k < out.len && out.ptr[k].is_err ? out.ptr[k].val.err.tag + 1 : SLUICE_OFFLOAD_OK;
        free(b->offloads[k].rewrites.ptr);
    }
    /* An empty list's pointer is not an allocation (free would fail). */
    if (out.len) sluice_nf_offload_list_result_void_offload_error_free(&out);
    b->noffloads = 0;
    return n;
}

const sluice_offload_return_t *sluice_offload_returns(sluice_batch_t *b, size_t *n) {
    if (!b->returns_taken) {
        b->returns_taken = true;
        /* Asked whenever the NF looks: entries carried here from another
         * host with their flows return to an instance that never asked. */
        sluice_nf_offload_returned(&b->returns);
    }
    *n = b->returns.len;
    return b->returns.ptr;
}

void sluice_revoke(const uint64_t *flow_hashes, size_t n) {
    if (!n) return;
    network_function_list_u64_t list = {(uint64_t *)flow_hashes, n};
    sluice_nf_offload_revoke(&list);
}

void sluice_revoke_all(void) { sluice_nf_offload_revoke_all(); }

/* ---- admission -------------------------------------------------------- */

#define ADMISSION_WAYS 4

typedef struct {
    uint64_t hash;
    uint32_t counts[2];
} admission_slot_t;

struct sluice_admission {
    uint32_t after;
    size_t sets; /* a power of two; 0 when every direction is admitted at once */
    admission_slot_t *slots;
};

sluice_admission_t *sluice_admission_new(uint32_t after, size_t slots) {
    sluice_admission_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->after = after;
    if (after <= 1) return a;
    if (slots < ADMISSION_WAYS) slots = ADMISSION_WAYS;
    if (slots > ((size_t)1 << 20)) slots = (size_t)1 << 20;
    size_t n = ADMISSION_WAYS;
    while (n < slots) n <<= 1;
    a->slots = calloc(n, sizeof *a->slots);
    if (!a->slots) {
        free(a);
        return NULL;
    }
    a->sets = n / ADMISSION_WAYS;
    return a;
}

static admission_slot_t *admission_set(sluice_admission_t *a, uint64_t hash) {
    return a->slots + (size_t)(hash & (a->sets - 1)) * ADMISSION_WAYS;
}

bool sluice_admit(sluice_admission_t *a, const sluice_packet_t *p) {
    if (!a || a->sets == 0) return true;
    admission_slot_t *set = admission_set(a, p->flow_hash), *slot = NULL;
    for (size_t k = 0; k < ADMISSION_WAYS && !slot; k++)
        if (set[k].hash == p->flow_hash) slot = &set[k];
    if (!slot) {
        /* The place of the flow with the fewest packets. */
        slot = &set[0];
        for (size_t k = 1; k < ADMISSION_WAYS; k++)
            if ((uint64_t)set[k].counts[0] + set[k].counts[1] < (uint64_t)slot->counts[0] + slot->counts[1])
                slot = &set[k];
        slot->hash = p->flow_hash;
        slot->counts[0] = slot->counts[1] = 0;
    }
    uint32_t *n = &slot->counts[(p->flags & SLUICE_FLAG_REVERSE) ? 1 : 0];
    if (*n < UINT32_MAX) (*n)++;
    return *n >= a->after;
}

void sluice_admission_forget(sluice_admission_t *a, const sluice_packet_t *p) {
    if (!a || a->sets == 0) return;
    admission_slot_t *set = admission_set(a, p->flow_hash);
    for (size_t k = 0; k < ADMISSION_WAYS; k++)
        if (set[k].hash == p->flow_hash) set[k].counts[0] = set[k].counts[1] = 0;
}

void sluice_admission_free(sluice_admission_t *a) {
    if (!a) return;
    free(a->slots);
    free(a);
}

/* Sends the batch's requests and, when the NF did not look, takes what
 * ended so the host keeps nothing for ever. */
static void flush_offloads(sluice_batch_t *b) {
    sluice_offload_now(b, NULL);
    size_t n;
    if (!b->returns_taken && offloaded_with_counts) sluice_offload_returns(b, &n);
}

static void release_batch(sluice_batch_t *b) {
    for (size_t k = 0; k < b->noffloads; k++) free(b->offloads[k].rewrites.ptr);
    free(b->offloads);
    if (b->returns.len) sluice_nf_offload_list_offload_return_free(&b->returns);
    if (b->rewrites) {
        for (uint32_t i = 0; i < b->n; i++) free(b->rewrites[i]);
        free(b->rewrites);
    }
    if (b->flows) {
        for (uint32_t i = 0; i < b->nflows; i++) free(b->flows[i].out);
        free(b->flows);
    }
    free(b->verdicts);
    network_function_list_u8_free(b->frame);
}

static uint32_t load32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Finds the parts of a batch frame by its 16-byte trailer (packets, data
 * bytes, flow-state bytes, reserved: little-endian u32s). */
static bool split_frame(sluice_batch_t *b, char *why, size_t why_len) {
    const uint8_t *f = b->frame->ptr;
    size_t size = b->frame->len;
    if (size < 16) {
        snprintf(why, why_len, "batch frame of %zu bytes: shorter than its 16-byte trailer", size);
        return false;
    }
    uint64_t n = load32(f + size - 16), data = load32(f + size - 12), states = load32(f + size - 8);
    uint64_t desc_at = (data + 7) & ~(uint64_t)7, states_at = desc_at + 32 * n;
    if (states_at + states + 16 != size) {
        snprintf(why, why_len,
                 "batch frame of %zu bytes: its trailer says %llu packets, %llu data bytes, %llu flow-state bytes", size,
                 (unsigned long long)n, (unsigned long long)data, (unsigned long long)states);
        return false;
    }
    b->data = f;
    b->data_len = (size_t)data;
    b->desc = f + desc_at;
    b->states = f + states_at;
    b->states_len = (size_t)states;
    b->n = (uint32_t)n;
    return true;
}

bool exports_sluice_nf_nf_process(network_function_list_u8_t *batch, exports_sluice_nf_nf_batch_result_t *ret,
                                  network_function_string_t *err) {
    sluice_batch_t b;
    memset(&b, 0, sizeof b);
    b.frame = batch;
    char why[160];
    if (!split_frame(&b, why, sizeof why)) {
        release_batch(&b);
        set_string(err, why);
        return false;
    }
    b.verdicts = malloc((b.n ? b.n : 1) * sizeof *b.verdicts);
    if (!b.verdicts || !index_flow_states(&b)) {
        release_batch(&b);
        set_string(err, "out of memory");
        return false;
    }
    for (uint32_t i = 0; i < b.n; i++) b.verdicts[i] = sluice_forward(0);

    sluice_error_t e;
    no_error(&e);
    bool ok = nf_process(&b, &e);
    flush_events(&b.events);
    if (ok) flush_offloads(&b);
    if (!ok) {
        release_batch(&b);
        set_string(err, e.message[0] ? e.message : "process failed");
        return false;
    }

    memset(ret, 0, sizeof *ret);
    ret->verdicts.ptr = b.verdicts;
    ret->verdicts.len = b.n;
    b.verdicts = NULL;
    size_t nrew = 0, nupd = 0;
    for (uint32_t i = 0; b.rewrites && i < b.n; i++) nrew += b.rewrites[i] != NULL;
    for (uint32_t i = 0; i < b.nflows; i++) nupd += b.flows[i].op != KEEP;
    if (nrew) {
        ret->rewrites.ptr = calloc(nrew, sizeof *ret->rewrites.ptr);
        for (uint32_t i = 0, k = 0; ret->rewrites.ptr && i < b.n; i++) {
            if (!b.rewrites[i]) continue;
            sluice_packet_t p = sluice_batch_packet(&b, i);
            ret->rewrites.ptr[k].packet = i;
            ret->rewrites.ptr[k].data.ptr = b.rewrites[i];
            ret->rewrites.ptr[k].data.len = p.len;
            b.rewrites[i] = NULL;
            k++;
        }
        ret->rewrites.len = ret->rewrites.ptr ? nrew : 0;
    }
    if (nupd) {
        ret->flow_updates.ptr = calloc(nupd, sizeof *ret->flow_updates.ptr);
        for (uint32_t i = 0, k = 0; ret->flow_updates.ptr && i < b.nflows; i++) {
            struct flow_slot *f = &b.flows[i];
            if (f->op == KEEP) continue;
            sluice_nf_types_flow_update_t *u = &ret->flow_updates.ptr[k++];
            u->flow = i;
            if (f->op == SET) {
                u->op.tag = SLUICE_NF_TYPES_STATE_OP_SET;
                u->op.val.set.ptr = f->out;
                u->op.val.set.len = f->out_len;
                f->out = NULL;
            } else {
                u->op.tag = SLUICE_NF_TYPES_STATE_OP_REMOVE;
            }
        }
        ret->flow_updates.len = ret->flow_updates.ptr ? nupd : 0;
    }
    release_batch(&b);
    return true;
}

bool exports_sluice_nf_nf_expired(exports_sluice_nf_nf_table_t table, network_function_list_u8_t *entries,
                                  network_function_string_t *err) {
    sluice_error_t e;
    no_error(&e);
    bool ok = nf_expired(table, entries->ptr, entries->len, &e);
    network_function_list_u8_free(entries);
    if (!ok) set_string(err, e.message[0] ? e.message : "expired failed");
    return ok;
}
