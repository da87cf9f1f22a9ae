/* peer_keys.h: CURVE keys for the test peers (td_hostile, td_runstart_peer,
 * td_intruder), which speak the peer protocol to real daemons.
 *
 * A test makes a key pair with `PROGRAM --keygen` (one line: PUBLIC SECRET),
 * admits PUBLIC on the daemons it wants the peer to reach (trainctl allow),
 * and hands the pair over in TD_PEER_PUBLIC / TD_PEER_SECRET. Without them a
 * peer speaks plain ZMTP, which a secure daemon refuses at the handshake. */
#ifndef TD_TEST_PEER_KEYS_H
#define TD_TEST_PEER_KEYS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "daemon/net/keys.h"

/* argv[1] == "--keygen": print a fresh pair and return 1 (the caller exits). */
static inline int peer_keys_keygen(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--keygen") != 0)
    return 0;
  char pub[41], secret[41];
  if (zmq_curve_keypair(pub, secret) != 0) {
    fprintf(stderr, "no CURVE in this libzmq\n");
    exit(77);
  }
  printf("%s %s\n", pub, secret);
  return 1;
}

/* The node id of our key pair from the environment; 0 when none is set. */
static inline uint64_t peer_keys_self_id(void) {
  const char *pub = getenv("TD_PEER_PUBLIC");
  uint8_t raw[TD_KEY_BYTES];
  char why[128];
  if (pub == NULL || td_key_decode(pub, raw, why, sizeof why) != 0)
    return 0;
  return td_key_node_id(raw);
}

/* Make `s` a CURVE client of the node whose key is server_key, with the
 * environment's pair; nothing when server_key or the pair is missing (plain
 * ZMTP). Returns 1 when CURVE was set. */
static inline int peer_keys_client(void *s, const char *server_key) {
  const char *pub = getenv("TD_PEER_PUBLIC"), *secret = getenv("TD_PEER_SECRET");
  if (server_key == NULL || server_key[0] == '\0' || pub == NULL || secret == NULL)
    return 0;
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, strlen(server_key));
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, strlen(pub));
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, secret, strlen(secret));
  return 1;
}

/* Make `s` a CURVE server with the environment's pair (no ZAP handler: it
 * accepts any client). Returns 1 when CURVE was set. */
static inline int peer_keys_server(void *s) {
  const char *secret = getenv("TD_PEER_SECRET");
  if (secret == NULL)
    return 0;
  int one = 1;
  zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, secret, strlen(secret));
  return 1;
}

#endif
