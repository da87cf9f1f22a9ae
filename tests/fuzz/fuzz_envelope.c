/* fuzz_envelope.c: libFuzzer target for the peer envelope decoder
 * (proto/wire.c) and the control request decoder. Every input must be
 * accepted with a body that passes validation or refused with TD_EPROTO. */
#include <stdint.h>
#include <stdlib.h>

#include "common/error.h"
#include "proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Traind__Envelope *env = NULL;
  char why[256];
  int rc = td_wire_unpack(&env, data, size, why, sizeof why);
  if (rc != 0 && rc != TD_EPROTO)
    abort();
  if (rc == 0 && (env == NULL || env->body_case == TRAIND__ENVELOPE__BODY__NOT_SET))
    abort();
  td_wire_free(&env);
  Traind__ControlRequest *req = NULL;
  rc = td_wire_unpack_request(&req, data, size, why, sizeof why);
  if (rc != 0 && rc != TD_EPROTO)
    abort();
  td_wire_free_request(&req);
  return 0;
}
