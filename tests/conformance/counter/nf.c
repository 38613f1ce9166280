/* Forwards every packet and counts packets and bytes on the wire in the
 * host table `totals` (key 0: packets, key 1: bytes), one counter-add per
 * batch. */
#include <sluice_nf.h>

static sluice_table_t totals;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    return sluice_declare_sum_counter("totals", 0, &totals, err);
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) bytes += sluice_batch_packet(batch, i).wire_len;
    uint64_t keys[2] = {0, 1};
    int64_t deltas[2] = {(int64_t)sluice_batch_len(batch), (int64_t)bytes};
    return sluice_counter_add(totals, keys, deltas, 2, err);
}
