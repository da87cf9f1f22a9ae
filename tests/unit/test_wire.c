/* test_wire.c: the wire module. Every body round-trips; wrong versions, missing
 * bodies, oversized and inconsistent messages (a state hash that is not 32
 * bytes) are refused with TD_EPROTO and a
 * reason; random and truncated bytes never crash the decoder. */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "compute/rng.h"
#include "proto/wire.h"

static Traind__Envelope heartbeat_envelope(Traind__Heartbeat *hb) {
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  traind__heartbeat__init(hb);
  hb->round = 7;
  hb->capacity = 1234.5;
  env.run_id = 0xfeedfacecafebeefull;
  env.sender = 42;
  env.seq = 9;
  env.body_case = TRAIND__ENVELOPE__BODY_HEARTBEAT;
  env.heartbeat = hb;
  return env;
}

START_TEST(heartbeat_round_trips) {
  Traind__Heartbeat hb;
  Traind__Envelope env = heartbeat_envelope(&hb);
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  Traind__Envelope *got = NULL;
  char why[128];
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), 0);
  ck_assert_uint_eq(got->version, TD_WIRE_VERSION);
  ck_assert_uint_eq(got->run_id, 0xfeedfacecafebeefull);
  ck_assert_uint_eq(got->sender, 42);
  ck_assert_int_eq(got->body_case, TRAIND__ENVELOPE__BODY_HEARTBEAT);
  ck_assert_uint_eq(got->heartbeat->round, 7);
  ck_assert_double_eq(got->heartbeat->capacity, 1234.5);
  ck_assert_str_eq(td_wire_body_name(got), "heartbeat");
  td_wire_free(&got);
  ck_assert_ptr_null(got);
  free(buf);
}
END_TEST

START_TEST(update_chunk_round_trips_and_limits_apply) {
  static uint8_t payload[TD_WIRE_MAX_CHUNK + 1];
  Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
  env.update = &up;
  up.round = 3;
  up.chunk = 1;
  up.chunks = 2;
  up.total_bytes = 2000;
  up.payload.data = payload;
  up.payload.len = 1000;
  memset(payload, 0xab, sizeof payload);
  uint8_t *buf;
  size_t len;
  char why[128] = "";
  Traind__Envelope *got = NULL;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), 0);
  ck_assert_uint_eq(got->update->payload.len, 1000);
  ck_assert_int_eq(memcmp(got->update->payload.data, payload, 1000), 0);
  td_wire_free(&got);
  free(buf);

  struct { uint32_t chunk, chunks; uint64_t total; size_t len; } bad[] = {
      {2, 2, 2000, 10},                        /* index past the end */
      {0, 0, 2000, 10},                        /* no chunks */
      {0, 1, 100, 1000},                       /* payload bigger than the whole */
      {0, 1, TD_WIRE_MAX_CHUNK + 1, TD_WIRE_MAX_CHUNK + 1}, /* oversized chunk */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    up.chunk = bad[i].chunk;
    up.chunks = bad[i].chunks;
    up.total_bytes = bad[i].total;
    up.payload.len = bad[i].len;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    why[0] = '\0';
    ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
    ck_assert_ptr_null(got);
    ck_assert_str_ne(why, "");
    free(buf);
  }
}
END_TEST

START_TEST(wrong_version_and_missing_body_are_refused) {
  Traind__Heartbeat hb;
  Traind__Envelope env = heartbeat_envelope(&hb);
  uint8_t buf[256];
  env.version = TD_WIRE_VERSION + 1;
  size_t len = traind__envelope__pack(&env, buf); /* bypasses td_wire_pack's version */
  Traind__Envelope *got = NULL;
  char why[128] = "";
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "version"));

  Traind__Envelope empty = TRAIND__ENVELOPE__INIT;
  empty.version = TD_WIRE_VERSION;
  len = traind__envelope__pack(&empty, buf);
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "body"));
}
END_TEST

START_TEST(too_many_peers_and_oversized_buffers_are_refused) {
  Traind__PeerInfo infos[TD_WIRE_MAX_PEERS + 1], *ptrs[TD_WIRE_MAX_PEERS + 1];
  for (int i = 0; i <= TD_WIRE_MAX_PEERS; i++) {
    traind__peer_info__init(&infos[i]);
    infos[i].node_id = (uint64_t)i + 1;
    infos[i].endpoint = "tcp://127.0.0.1:5000";
    ptrs[i] = &infos[i];
  }
  Traind__Welcome w = TRAIND__WELCOME__INIT;
  w.peers = ptrs;
  w.n_peers = TD_WIRE_MAX_PEERS + 1;
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;
  uint8_t *buf;
  size_t len;
  char why[128] = "";
  Traind__Envelope *got = NULL;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "peers"));
  free(buf);
  /* the size limit is checked before protobuf-c sees the bytes */
  static uint8_t big[TD_WIRE_MAX_MESSAGE + 1];
  ck_assert_int_eq(td_wire_unpack(&got, big, sizeof big, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "limit"));
}
END_TEST

/* A state hash is 32 bytes, or none (a request); any other length is refused. */
START_TEST(state_hash_is_32_bytes_or_a_request) {
  uint8_t hash[TD_WIRE_STATE_HASH_BYTES + 1];
  memset(hash, 0x5a, sizeof hash);
  size_t lens[] = {TD_WIRE_STATE_HASH_BYTES, 0, 31, TD_WIRE_STATE_HASH_BYTES + 1};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    Traind__StateHash sh = TRAIND__STATE_HASH__INIT;
    sh.round = 40;
    sh.hash.data = hash;
    sh.hash.len = lens[i];
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_STATE_HASH;
    env.state_hash = &sh;
    env.sender = 3;
    uint8_t *buf;
    size_t len;
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    int rc = td_wire_unpack(&got, buf, len, why, sizeof why);
    if (i < 2) {
      ck_assert_int_eq(rc, 0);
      ck_assert_uint_eq(got->state_hash->round, 40);
      ck_assert_uint_eq(got->state_hash->hash.len, lens[i]);
      ck_assert_str_eq(td_wire_body_name(got), "state_hash");
      td_wire_free(&got);
    } else {
      ck_assert_int_eq(rc, TD_EPROTO);
      ck_assert_ptr_nonnull(strstr(why, "state hash"));
    }
    free(buf);
  }
}
END_TEST

/* A round close names its round and at least one member. */
START_TEST(round_close_needs_a_round_and_a_member) {
  const uint64_t rounds[] = {7, 0, 7}, members[] = {0x5, 0x5, 0};
  for (size_t i = 0; i < 3; i++) {
    Traind__RoundClose rc = TRAIND__ROUND_CLOSE__INIT;
    rc.round = rounds[i];
    rc.members = members[i];
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_ROUND_CLOSE;
    env.round_close = &rc;
    env.sender = 3;
    uint8_t *buf;
    size_t len;
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    int rc_unpack = td_wire_unpack(&got, buf, len, why, sizeof why);
    if (i == 0) {
      ck_assert_int_eq(rc_unpack, 0);
      ck_assert_uint_eq(got->round_close->round, 7);
      ck_assert_uint_eq(got->round_close->members, 0x5);
      ck_assert_str_eq(td_wire_body_name(got), "round_close");
      td_wire_free(&got);
    } else {
      ck_assert_int_eq(rc_unpack, TD_EPROTO);
      ck_assert_ptr_nonnull(strstr(why, "round close"));
    }
    free(buf);
  }
}
END_TEST

/* An update request names a round and a member, or asks for the round's
 * close; an update's or a round close's signature, when it carries one, is
 * 64 bytes. */
/* rc packed in an envelope and read back: td_wire_unpack's result, *got
 * (NULL when refused) and its why. */
static int close_round_trip(Traind__RoundClose *rc, Traind__Envelope **got, char *why,
                            size_t why_len) {
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_ROUND_CLOSE;
  env.round_close = rc;
  uint8_t *buf;
  size_t len;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  int r = td_wire_unpack(got, buf, len, why, why_len);
  free(buf);
  return r;
}

START_TEST(update_request_and_signature_are_checked) {
  const uint64_t rounds[] = {7, 0, 7}, members[] = {9, 9, 0};
  for (size_t i = 0; i < 3; i++) {
    Traind__UpdateRequest rq = TRAIND__UPDATE_REQUEST__INIT;
    rq.round = rounds[i];
    rq.member = members[i];
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE_REQUEST;
    env.update_request = &rq;
    env.sender = 3;
    uint8_t *buf;
    size_t len;
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    int rc = td_wire_unpack(&got, buf, len, why, sizeof why);
    if (i == 0) {
      ck_assert_int_eq(rc, 0);
      ck_assert_uint_eq(got->update_request->member, 9);
      ck_assert_str_eq(td_wire_body_name(got), "update_request");
      td_wire_free(&got);
    } else {
      ck_assert_int_eq(rc, TD_EPROTO);
      ck_assert_ptr_nonnull(strstr(why, "update request"));
    }
    free(buf);
  }
  /* a request for the round's close names no member */
  const bool closes[] = {true, true};
  const uint64_t close_members[] = {0, 9};
  for (size_t i = 0; i < 2; i++) {
    Traind__UpdateRequest rq = TRAIND__UPDATE_REQUEST__INIT;
    rq.round = 7;
    rq.member = close_members[i];
    rq.close = closes[i];
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE_REQUEST;
    env.update_request = &rq;
    uint8_t *buf;
    size_t len;
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    int rc = td_wire_unpack(&got, buf, len, why, sizeof why);
    ck_assert_int_eq(rc, i == 0 ? 0 : TD_EPROTO);
    if (got != NULL) {
      ck_assert(got->update_request->close);
      td_wire_free(&got);
    }
    free(buf);
  }
  /* a round close's signature, when it carries one, is 64 bytes */
  for (size_t i = 0; i < 3; i++) {
    uint8_t rsig[65] = {0};
    const size_t rlens[] = {64, 0, 65};
    Traind__RoundClose rc = TRAIND__ROUND_CLOSE__INIT;
    rc.round = 3;
    rc.members = 0x3;
    rc.coordinator = 5;
    rc.signature = (ProtobufCBinaryData){.len = rlens[i], .data = rsig};
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(close_round_trip(&rc, &got, why, sizeof why), i < 2 ? 0 : TD_EPROTO);
    if (got != NULL) {
      ck_assert_uint_eq(got->round_close->coordinator, 5);
      td_wire_free(&got);
    }
  }
  /* its digests: 32 bytes per member of the set (0x3: two), with their
   * signature of 64 bytes, or neither */
  for (size_t i = 0; i < 6; i++) {
    uint8_t dig[96] = {0}, dsig[65] = {0};
    const size_t dlens[] = {64, 0, 32, 96, 64, 0};
    const size_t slens[] = {64, 0, 64, 64, 0, 64};
    Traind__RoundClose rc = TRAIND__ROUND_CLOSE__INIT;
    rc.round = 3;
    rc.members = 0x3;
    rc.digests = (ProtobufCBinaryData){.len = dlens[i], .data = dig};
    rc.digests_signature = (ProtobufCBinaryData){.len = slens[i], .data = dsig};
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(close_round_trip(&rc, &got, why, sizeof why), i < 2 ? 0 : TD_EPROTO);
    if (got != NULL) {
      ck_assert_uint_eq(got->round_close->digests.len, dlens[i]);
      td_wire_free(&got);
    } else {
      ck_assert_ptr_nonnull(strstr(why, "digests"));
    }
  }
  /* an update's own signature and the coordinator's echoed with it */
  uint8_t sig[65] = {0}, payload[4] = {0};
  const size_t lens[] = {64, 0, 63, 65};
  for (size_t k = 0; k < 8; k++) {
    size_t i = k % 4;
    bool echoed = k >= 4;
    Traind__UpdateChunk up = TRAIND__UPDATE_CHUNK__INIT;
    up.round = 2;
    up.chunks = 1;
    up.total_bytes = sizeof payload;
    up.payload = (ProtobufCBinaryData){.len = sizeof payload, .data = payload};
    up.origin = 11;
    ProtobufCBinaryData *field = echoed ? &up.applied_signature : &up.signature;
    *field = (ProtobufCBinaryData){.len = lens[i], .data = sig};
    Traind__Envelope env = TRAIND__ENVELOPE__INIT;
    env.body_case = TRAIND__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    env.sender = 3;
    uint8_t *buf;
    size_t len;
    char why[128] = "";
    Traind__Envelope *got = NULL;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    int rc = td_wire_unpack(&got, buf, len, why, sizeof why);
    if (lens[i] == 64 || lens[i] == 0) {
      ck_assert_int_eq(rc, 0);
      ck_assert_uint_eq(got->update->origin, 11);
      ck_assert_uint_eq(echoed ? got->update->applied_signature.len : got->update->signature.len,
                        lens[i]);
      td_wire_free(&got);
    } else {
      ck_assert_int_eq(rc, TD_EPROTO);
      ck_assert_ptr_nonnull(strstr(why, "signature"));
    }
    free(buf);
  }
}
END_TEST

/* A relayed message (--listen none) needs its origin, target, sequence
 * number, a 64-byte signature and an inner message that leaves room for the
 * wrapper. */
START_TEST(relay_envelopes_are_checked) {
  static uint8_t inner[TD_WIRE_MAX_RELAYED + 1], sig[TD_WIRE_SIGNATURE_BYTES + 1];
  Traind__Relay r = TRAIND__RELAY__INIT;
  r.origin = 1;
  r.target = 2;
  r.seq = 1;
  r.inner = (ProtobufCBinaryData){.len = 100, .data = inner};
  r.signature = (ProtobufCBinaryData){.len = TD_WIRE_SIGNATURE_BYTES, .data = sig};
  Traind__Envelope env = TRAIND__ENVELOPE__INIT;
  env.body_case = TRAIND__ENVELOPE__BODY_RELAY;
  env.relay = &r;
  uint8_t *buf;
  size_t len;
  char why[256] = "";
  Traind__Envelope *got = NULL;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), 0);
  ck_assert_uint_eq(got->relay->inner.len, 100);
  ck_assert_str_eq(td_wire_body_name(got), "relay");
  td_wire_free(&got);
  free(buf);
  struct {
    uint64_t origin, target;
    size_t inner, sig;
  } bad[] = {{0, 2, 100, 64}, {1, 0, 100, 64}, {1, 2, 0, 64}, {1, 2, 100, 63},
             {1, 2, 100, 65}, {1, 2, TD_WIRE_MAX_RELAYED + 1, 64}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r.origin = bad[i].origin;
    r.target = bad[i].target;
    r.inner.len = bad[i].inner;
    r.signature.len = bad[i].sig;
    ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
    ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
    ck_assert_ptr_nonnull(strstr(why, "relay"));
    free(buf);
  }
  r.origin = 1; /* all else right, but no sequence number: no replay window can hold it */
  r.target = 2;
  r.inner.len = 100;
  r.signature.len = TD_WIRE_SIGNATURE_BYTES;
  r.seq = 0;
  ck_assert_int_eq(td_wire_pack(&env, &buf, &len), 0);
  ck_assert_int_eq(td_wire_unpack(&got, buf, len, why, sizeof why), TD_EPROTO);
  ck_assert_ptr_nonnull(strstr(why, "sequence"));
  free(buf);
}
END_TEST

/* Hostile input: random bytes and every truncation of a valid message. */
START_TEST(random_and_truncated_bytes_never_crash) {
  td_rng_t rng;
  td_rng_seed(&rng, 99);
  uint8_t buf[512];
  int accepted = 0;
  for (int i = 0; i < 20000; i++) {
    size_t len = td_rng_below(&rng, sizeof buf);
    for (size_t j = 0; j < len; j++)
      buf[j] = (uint8_t)td_rng_next(&rng);
    Traind__Envelope *got = NULL;
    int rc = td_wire_unpack(&got, buf, len, NULL, 0);
    ck_assert(rc == 0 || rc == TD_EPROTO);
    ck_assert(rc != 0 || got != NULL);
    accepted += rc == 0;
    td_wire_free(&got);
  }
  ck_assert_int_lt(accepted, 200); /* random bytes are almost never a valid message */
  Traind__Heartbeat hb;
  Traind__Envelope env = heartbeat_envelope(&hb);
  uint8_t *full;
  size_t len;
  ck_assert_int_eq(td_wire_pack(&env, &full, &len), 0);
  for (size_t cut = 0; cut < len; cut++) {
    Traind__Envelope *got = NULL;
    int rc = td_wire_unpack(&got, full, cut, NULL, 0);
    ck_assert(rc == 0 || rc == TD_EPROTO);
    td_wire_free(&got);
  }
  free(full);
}
END_TEST

START_TEST(control_messages_round_trip) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = TRAIND__CONTROL_REQUEST__COMMAND__JOIN;
  req.endpoint = "tcp://127.0.0.1:7000";
  uint8_t *buf;
  size_t len;
  char why[128];
  ck_assert_int_eq(td_wire_pack_request(&req, &buf, &len), 0);
  Traind__ControlRequest *got = NULL;
  ck_assert_int_eq(td_wire_unpack_request(&got, buf, len, why, sizeof why), 0);
  ck_assert_int_eq(got->command, TRAIND__CONTROL_REQUEST__COMMAND__JOIN);
  ck_assert_str_eq(got->endpoint, "tcp://127.0.0.1:7000");
  td_wire_free_request(&got);
  free(buf);
  Traind__ControlResponse resp = TRAIND__CONTROL_RESPONSE__INIT;
  resp.status = TD_ECONFIG;
  resp.error = "bad spec";
  ck_assert_int_eq(td_wire_pack_response(&resp, &buf, &len), 0);
  Traind__ControlResponse *r = NULL;
  ck_assert_int_eq(td_wire_unpack_response(&r, buf, len, why, sizeof why), 0);
  ck_assert_int_eq(r->status, TD_ECONFIG);
  ck_assert_str_eq(r->error, "bad spec");
  td_wire_free_response(&r);
  free(buf);
}
END_TEST

int main(void) {
  Suite *s = suite_create("wire");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, heartbeat_round_trips);
  tcase_add_test(tc, update_chunk_round_trips_and_limits_apply);
  tcase_add_test(tc, wrong_version_and_missing_body_are_refused);
  tcase_add_test(tc, too_many_peers_and_oversized_buffers_are_refused);
  tcase_add_test(tc, state_hash_is_32_bytes_or_a_request);
  tcase_add_test(tc, random_and_truncated_bytes_never_crash);
  tcase_add_test(tc, control_messages_round_trip);
  tcase_add_test(tc, relay_envelopes_are_checked);
  tcase_add_test(tc, round_close_needs_a_round_and_a_member);
  tcase_add_test(tc, update_request_and_signature_are_checked);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
