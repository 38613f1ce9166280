/* Counts IPv4 TCP packets per destination port and lists the table with
 * scan and top-k (see nf.rs for the full description): per batch, one
 * counter-add on the eventual table `ports`; on the batch's first SYN (ACK
 * clear), a `conformance.scan` event with the top 3 ports, what a full
 * scan of `ports` in pages of 16 walks, and the keys of the read-only byte
 * table `names` scanned in pages of 2. */
#include <sluice_nf.h>
#include <stdio.h>
#include <string.h>

static sluice_table_t ports, names;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    sluice_table_spec_t spec;
    if (!sluice_declare_sum_counter("ports", 0, &ports, err)) return false;
    sluice_spec_read_only_bytes(&spec, "names", 0, 8);
    if (!sluice_declare(&spec, &names, err)) return false;
    static const char *const items[] = {"http", "80", "https", "443", "dns", "53", "ssh", "22", "ntp", "123"};
    sluice_buf_t entries = {0};
    for (size_t i = 0; i < sizeof items / sizeof *items; i++)
        if (!sluice_frame_push(&entries, items[i], (uint32_t)strlen(items[i]))) return sluice_fail(err, "out of memory");
    bool ok = sluice_put_many(names, entries.ptr, entries.len, err);
    sluice_buf_free(&entries);
    return ok;
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint64_t keys[256];
    int64_t counts[256];
    size_t n = 0;
    int64_t trigger = -1;
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (!sluice_is_ipv4(&p) || !sluice_is_tcp(&p)) continue;
        uint64_t port = sluice_dst_port(&p);
        size_t at = 0;
        while (at < n && keys[at] != port) at++;
        if (at == n) {
            if (n == sizeof keys / sizeof *keys) return sluice_fail(err, "too many ports in one batch");
            keys[n] = port, counts[n] = 0, n++;
        }
        counts[at]++;
        uint8_t flags = sluice_tcp_flags(&p);
        if (trigger < 0 && (flags & SLUICE_TCP_SYN) && !(flags & SLUICE_TCP_ACK)) trigger = i;
    }
    if (n > 0 && !sluice_counter_add(ports, keys, counts, n, err)) return false;
    if (trigger < 0) return true;

    sluice_counter_entry_t top[3];
    size_t n_top = 0;
    if (!sluice_top_k(ports, 3, top, &n_top, err)) return false;
    char top_text[128] = "";
    for (size_t i = 0; i < n_top; i++) {
        size_t used = strlen(top_text);
        snprintf(top_text + used, sizeof top_text - used, "%s%llu=%llu", i ? "," : "", (unsigned long long)top[i].key,
                 (unsigned long long)top[i].value);
    }

    uint64_t entries = 0, pages = 0, total = 0, last = 0;
    bool ascending = true;
    sluice_buf_t cursor = {0};
    for (;;) {
        sluice_scan_page_t page;
        if (!sluice_scan(ports, cursor.ptr, cursor.len, 16, &page, err)) return sluice_buf_free(&cursor), false;
        pages++;
        for (size_t i = 0; i < page.n_counters; i++) {
            if (entries > 0 && page.counters[i].key <= last) ascending = false;
            entries++;
            total += page.counters[i].value;
            last = page.counters[i].key;
        }
        sluice_buf_free(&cursor);
        cursor = page.cursor;
        page.cursor = (sluice_buf_t){0};
        sluice_scan_page_free(&page);
        if (cursor.len == 0) break;
    }
    sluice_buf_free(&cursor);

    char names_text[128] = "";
    for (;;) {
        sluice_scan_page_t page;
        if (!sluice_scan(names, cursor.ptr, cursor.len, 2, &page, err)) return sluice_buf_free(&cursor), false;
        size_t at = 0, item = 0;
        const uint8_t *data;
        uint32_t data_len;
        while (sluice_frame_next(page.entries.ptr, page.entries.len, &at, &data, &data_len)) {
            if (item++ % 2) continue;
            size_t used = strlen(names_text);
            snprintf(names_text + used, sizeof names_text - used, "%s%.*s", used ? "," : "", (int)data_len,
                     (const char *)data);
        }
        sluice_buf_free(&cursor);
        cursor = page.cursor;
        page.cursor = (sluice_buf_t){0};
        sluice_scan_page_free(&page);
        if (cursor.len == 0) break;
    }
    sluice_buf_free(&cursor);

    char entries_text[24], pages_text[24], total_text[24];
    snprintf(entries_text, sizeof entries_text, "%llu", (unsigned long long)entries);
    snprintf(pages_text, sizeof pages_text, "%llu", (unsigned long long)pages);
    snprintf(total_text, sizeof total_text, "%llu", (unsigned long long)total);
    const char *fields[] = {"top",   top_text,   "entries",   entries_text,           "pages", pages_text,
                            "total", total_text, "ascending", ascending ? "yes" : "no", "names", names_text};
    if (!sluice_event(batch, "conformance.scan", SLUICE_INFO, trigger, fields, 6)) return sluice_fail(err, "out of memory");
    return true;
}
