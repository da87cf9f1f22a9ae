/* agree.c: the canonical state hash and the majority vote (agree.h). */
#include "scheduler/agree.h"

#include <sodium.h>
#include <string.h>

#include "common/error.h"

/* Floats converted to little-endian bytes per block, so a big-endian host
 * hashes the same bytes without a copy of the whole model. */
#define BLOCK_FLOATS 4096

static void hash_floats(crypto_generichash_state *st, const float *x, size_t n) {
  uint8_t block[BLOCK_FLOATS * 4];
  for (size_t off = 0; off < n; off += BLOCK_FLOATS) {
    size_t k = n - off < BLOCK_FLOATS ? n - off : BLOCK_FLOATS;
    for (size_t i = 0; i < k; i++) {
      uint32_t bits;
      memcpy(&bits, &x[off + i], 4);
      block[4 * i] = (uint8_t)bits;
      block[4 * i + 1] = (uint8_t)(bits >> 8);
      block[4 * i + 2] = (uint8_t)(bits >> 16);
      block[4 * i + 3] = (uint8_t)(bits >> 24);
    }
    crypto_generichash_update(st, block, 4 * k);
  }
}

static void hash_tensors(crypto_generichash_state *st, const td_layout_t *layout,
                         const float *x) {
  for (size_t t = 0; t < td_layout_count(layout); t++) {
    const td_tensor_info_t *ti = td_layout_tensor(layout, t);
    hash_floats(st, x + ti->offset, ti->numel);
  }
}

int td_agree_hash(const td_layout_t *layout, const float *anchor, const float *mom,
                  uint8_t out[TD_AGREE_HASH_BYTES]) {
  crypto_generichash_state st;
  if (sodium_init() < 0 || crypto_generichash_init(&st, NULL, 0, TD_AGREE_HASH_BYTES) != 0)
    return TD_EIO;
  hash_tensors(&st, layout, anchor);
  if (mom != NULL)
    hash_tensors(&st, layout, mom);
  crypto_generichash_final(&st, out, TD_AGREE_HASH_BYTES);
  return 0;
}

void td_agree_short(const uint8_t hash[TD_AGREE_HASH_BYTES], char text[17]) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < 8; i++) {
    text[2 * i] = hex[hash[i] >> 4];
    text[2 * i + 1] = hex[hash[i] & 15];
  }
  text[16] = '\0';
}

size_t td_agree_decide(const uint8_t (*hashes)[TD_AGREE_HASH_BYTES], size_t n, size_t members,
                       size_t *holders) {
  size_t best = TD_AGREE_NONE, most = 0;
  for (size_t i = 0; i < n; i++) {
    size_t same = 0;
    for (size_t j = 0; j < n; j++)
      same += memcmp(hashes[i], hashes[j], TD_AGREE_HASH_BYTES) == 0;
    if (same > most) {
      most = same;
      best = i;
    }
  }
  *holders = most;
  if (n > members || 2 * most <= members)
    return TD_AGREE_NONE;
  return best;
}
