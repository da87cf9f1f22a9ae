/* td_tamper.c: the hostile relay of tests/integration/traind_tamper, a traind
 * linked from the same library with `-Wl,--wrap=td_wire_pack`, so that the
 * product's code holds no hook: every Relay envelope it passes on for
 * another node (origin not itself) has one byte of the relayed message
 * flipped before it is packed. What it sends of its own is untouched, so it
 * stays a member in good standing; cluster_noinbound.sh checks that the
 * target rejects what it altered (counted as bad_relay, logged). */
#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

/* The library's own function, which the linker renamed for this program. */
int __real_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);

int __wrap_td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len) {
  if (env->body_case == TRAIND__ENVELOPE__BODY_RELAY && env->relay->origin != env->sender &&
      env->relay->inner.len > 0)
    env->relay->inner.data[env->relay->inner.len / 2] ^= 0x01; /* its own copy, about to go */
  return __real_td_wire_pack(env, out, len);
}
