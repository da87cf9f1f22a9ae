/* td_forge.c: a hostile member with an admitted key (not admin) that sends
 * forged admission records, for cluster_invite.sh.
 *
 *   td_forge ENDPOINT SERVER_KEY badsig SUBJECT_KEY ADMIN_KEY
 *       an admission of SUBJECT_KEY that claims ADMIN_KEY signed it (the
 *       signature is the forger's own, so it cannot verify)
 *   td_forge ENDPOINT SERVER_KEY nonadmin SUBJECT_KEY
 *       an admission of SUBJECT_KEY, signed for real by the forger, whose key
 *       is no admin (its hello names its signing key first, so the node can
 *       check the signature and must still refuse it)
 *   td_forge ENDPOINT SERVER_KEY replay HEX
 *       the record HEX (an old admission, from an admissions file) as it was
 *
 * The record layout is daemon/net/admission.h's, built here from libsodium
 * alone, as an attacker would. Its CURVE pair comes from TD_PEER_PUBLIC /
 * TD_PEER_SECRET (peer_keys.h). Exits 0 when it sent, 2 on bad arguments. */
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "proto/wire.h"
#include "tests/integration/peer_keys.h"

#define RECORD_BYTES 174
#define SIGNED_BYTES (RECORD_BYTES - 64)

static void send_env(void *s, Traind__Envelope *env, uint64_t self_id) {
  uint8_t *buf = NULL;
  size_t len = 0;
  env->version = TD_WIRE_VERSION;
  env->sender = self_id;
  if (td_wire_pack(env, &buf, &len) == 0)
    zmq_send(s, buf, len, 0);
  free(buf);
}

static int decode(const char *z85, uint8_t raw[32]) {
  return strlen(z85) == 40 && zmq_z85_decode(raw, z85) != NULL ? 0 : -1;
}

/* An admission of `subject` naming `signer`, signed with `sign_secret`. */
static void make_record(uint8_t out[RECORD_BYTES], const uint8_t subject[32],
                        const uint8_t signer[32], const uint8_t sign_secret[64]) {
  memset(out, 0, RECORD_BYTES);
  memcpy(out, "TDA1", 4);
  out[4] = 1; /* admit */
  out[5] = 1; /* as admin, for good measure */
  uint64_t us = (uint64_t)time(NULL) * 1000000u + 999999u;
  for (int i = 7; i >= 0; i--, us >>= 8)
    out[6 + i] = (uint8_t)us;
  memcpy(out + 14, subject, 32);
  randombytes_buf(out + 46, 32); /* the subject's signing key: anything */
  memcpy(out + 78, signer, 32);
  crypto_sign_detached(out + SIGNED_BYTES, NULL, out, SIGNED_BYTES, sign_secret);
}

int main(int argc, char **argv) {
  if (peer_keys_keygen(argc, argv))
    return 0;
  if (argc < 5 || sodium_init() < 0) {
    fprintf(stderr, "usage: td_forge ENDPOINT SERVER_KEY badsig|nonadmin|replay ...\n");
    return 2;
  }
  const char *attack = argv[3], *pub = getenv("TD_PEER_PUBLIC");
  uint8_t self[32], subject[32], signer[32], record[RECORD_BYTES];
  uint8_t sign_pub[32], sign_secret[64];
  if (pub == NULL || decode(pub, self) != 0) {
    fprintf(stderr, "td_forge: TD_PEER_PUBLIC / TD_PEER_SECRET must hold its key pair\n");
    return 2;
  }
  crypto_sign_keypair(sign_pub, sign_secret);
  if (strcmp(attack, "badsig") == 0 && argc == 6 && decode(argv[4], subject) == 0 &&
      decode(argv[5], signer) == 0) {
    make_record(record, subject, signer, sign_secret);
  } else if (strcmp(attack, "nonadmin") == 0 && argc == 5 && decode(argv[4], subject) == 0) {
    make_record(record, subject, self, sign_secret);
  } else if (strcmp(attack, "replay") == 0 && argc == 5 && strlen(argv[4]) == 2 * RECORD_BYTES) {
    size_t n = 0;
    if (sodium_hex2bin(record, sizeof record, argv[4], strlen(argv[4]), NULL, &n, NULL) != 0 ||
        n != RECORD_BYTES)
      return 2;
  } else {
    fprintf(stderr, "td_forge: bad arguments for %s\n", attack);
    return 2;
  }
  void *ctx = zmq_ctx_new(), *dealer = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 2000;
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
  peer_keys_client(dealer, argv[2]);
  if (zmq_connect(dealer, argv[1]) != 0)
    return 1;
  uint64_t self_id = td_key_node_id(self);
  Traind__Hello hello = TRAIND__HELLO__INIT;
  hello.endpoint = "tcp://127.0.0.1:9";
  hello.sign_key = (ProtobufCBinaryData){.len = 32, .data = sign_pub};
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_HELLO;
  env.hello = &hello;
  send_env(dealer, &env, self_id);
  ProtobufCBinaryData bin = {.len = RECORD_BYTES, .data = record};
  Traind__Admissions adm = TRAIND__ADMISSIONS__INIT;
  adm.records = &bin;
  adm.n_records = 1;
  Traind__Envelope env2 = TRAIND__ENVELOPE__INIT;
  env2.body_case = TRAIND__ENVELOPE__BODY_ADMISSIONS;
  env2.admissions = &adm;
  send_env(dealer, &env2, self_id);
  struct timespec half = {0, 500 * 1000 * 1000};
  nanosleep(&half, NULL);
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  printf("sent %s\n", attack);
  return 0;
}
