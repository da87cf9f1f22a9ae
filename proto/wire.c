/* wire.c: packing, unpacking and validation of every message traind exchanges.
 *
 * protobuf-c's unpacker is memory-safe on arbitrary bytes but allocates in
 * proportion to the input, so the size limit is applied first; the semantic
 * limits (counts, lengths, chunk indices) are applied after. */
#include "proto/wire.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static int pack_common(const ProtobufCMessage *msg, size_t limit, uint8_t **out, size_t *len) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  if (n > limit)
    return TD_ERANGE;
  uint8_t *buf = malloc(n ? n : 1);
  if (buf == NULL)
    return TD_ENOMEM;
  size_t written = protobuf_c_message_pack(msg, buf);
  if (written != n) {
    free(buf);
    return TD_EPROTO;
  }
  *out = buf;
  *len = n;
  return 0;
}

int td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len) {
  env->version = TD_WIRE_VERSION;
  return pack_common(&env->base, TD_WIRE_MAX_MESSAGE, out, len);
}

static int check_string(const char *s, size_t max, const char *what, char *why, size_t n) {
  if (s != NULL && strlen(s) > max)
    return td_why(why, n, TD_EPROTO, "%s longer than %zu bytes", what, max);
  return 0;
}

static int check_peers(Traind__PeerInfo **peers, size_t count, char *why, size_t n) {
  if (count > TD_WIRE_MAX_PEERS)
    return td_why(why, n, TD_EPROTO, "%zu peers in one message (limit %d)", count,
                  TD_WIRE_MAX_PEERS);
  for (size_t i = 0; i < count; i++) {
    int rc = check_string(peers[i]->endpoint, TD_WIRE_MAX_STRING, "peer endpoint", why, n);
    if (rc != 0)
      return rc;
    if (peers[i]->state > 3)
      return td_why(why, n, TD_EPROTO, "peer state %u unknown", peers[i]->state);
  }
  return 0;
}

static int check_chunk(uint32_t chunk, uint32_t chunks, uint64_t total, size_t payload,
                       char *why, size_t n) {
  if (chunks == 0 || chunks > TD_WIRE_MAX_CHUNKS || chunk >= chunks)
    return td_why(why, n, TD_EPROTO, "chunk %u of %u is out of range", chunk, chunks);
  if (payload > TD_WIRE_MAX_CHUNK)
    return td_why(why, n, TD_EPROTO, "chunk payload of %zu bytes (limit %u)", payload,
                  TD_WIRE_MAX_CHUNK);
  if (total > TD_WIRE_MAX_TRANSFER || payload > total)
    return td_why(why, n, TD_EPROTO, "transfer size %llu is inconsistent",
                  (unsigned long long)total);
  return 0;
}

static int check_records(const ProtobufCBinaryData *records, size_t count, char *why, size_t n) {
  if (count > TD_WIRE_MAX_RECORDS)
    return td_why(why, n, TD_EPROTO, "%zu admission records in one message (limit %d)", count,
                  TD_WIRE_MAX_RECORDS);
  for (size_t i = 0; i < count; i++)
    if (records[i].len != TD_WIRE_RECORD_BYTES)
      return td_why(why, n, TD_EPROTO, "admission record of %zu bytes (they have %d)",
                    records[i].len, TD_WIRE_RECORD_BYTES);
  return 0;
}

static int validate(const Traind__Envelope *e, char *why, size_t n) {
  if (e->version != TD_WIRE_VERSION)
    return td_why(why, n, TD_EPROTO, "protocol version %u (this node speaks %d)", e->version,
                  TD_WIRE_VERSION);
  switch (e->body_case) {
  case TRAIND__ENVELOPE__BODY_HELLO:
    if (e->hello->sign_key.len != 0 && e->hello->sign_key.len != TD_WIRE_KEY_BYTES)
      return td_why(why, n, TD_EPROTO, "hello signing key of %zu bytes", e->hello->sign_key.len);
    return check_string(e->hello->endpoint, TD_WIRE_MAX_STRING, "hello endpoint", why, n);
  case TRAIND__ENVELOPE__BODY_ADMISSIONS:
    return check_records(e->admissions->records, e->admissions->n_records, why, n);
  case TRAIND__ENVELOPE__BODY_JOIN_GRANT: {
    int rc = check_records(e->join_grant->records, e->join_grant->n_records, why, n);
    return rc ? rc : check_string(e->join_grant->refused, TD_WIRE_MAX_STRING, "refusal", why, n);
  }
  case TRAIND__ENVELOPE__BODY_JOIN_REQUEST:
    if (e->join_request->key.len != TD_WIRE_KEY_BYTES ||
        e->join_request->sign_key.len != TD_WIRE_KEY_BYTES ||
        e->join_request->proof.len != TD_WIRE_SIGNATURE_BYTES)
      return td_why(why, n, TD_EPROTO, "join request with keys or proof of the wrong size");
    return 0;
  case TRAIND__ENVELOPE__BODY_WELCOME: {
    int rc = check_peers(e->welcome->peers, e->welcome->n_peers, why, n);
    if (rc == 0)
      rc = check_string(e->welcome->refused, TD_WIRE_MAX_STRING, "refusal reason", why, n);
    return rc ? rc : check_string(e->welcome->run_spec, TD_WIRE_MAX_SPEC, "run spec", why, n);
  }
  case TRAIND__ENVELOPE__BODY_HEARTBEAT:
    return check_peers(e->heartbeat->peers, e->heartbeat->n_peers, why, n);
  case TRAIND__ENVELOPE__BODY_LEAVE:
    return check_string(e->leave->reason, TD_WIRE_MAX_STRING, "leave reason", why, n);
  case TRAIND__ENVELOPE__BODY_RUN_START:
    if (e->run_start->n_members == 0 || e->run_start->n_members > TD_WIRE_MAX_RUN_MEMBERS)
      return td_why(why, n, TD_EPROTO, "run start with %zu members (limit %d)",
                    e->run_start->n_members, TD_WIRE_MAX_RUN_MEMBERS);
    return check_string(e->run_start->spec, TD_WIRE_MAX_SPEC, "run spec", why, n);
  case TRAIND__ENVELOPE__BODY_RUN_STOP:
    return check_string(e->run_stop->reason, TD_WIRE_MAX_STRING, "stop reason", why, n);
  case TRAIND__ENVELOPE__BODY_RUN_REFUSED:
    return check_string(e->run_refused->reason, TD_WIRE_MAX_STRING, "refusal reason", why, n);
  case TRAIND__ENVELOPE__BODY_UPDATE:
    if (e->update->n_heard_capacity > TD_WIRE_MAX_RUN_MEMBERS)
      return td_why(why, n, TD_EPROTO, "update echoing %zu capacities",
                    e->update->n_heard_capacity);
    if (e->update->signature.len != 0 && e->update->signature.len != TD_WIRE_SIGNATURE_BYTES)
      return td_why(why, n, TD_EPROTO, "update signature of %zu bytes (one has %d)",
                    e->update->signature.len, TD_WIRE_SIGNATURE_BYTES);
    if (e->update->applied_signature.len != 0 &&
        e->update->applied_signature.len != TD_WIRE_SIGNATURE_BYTES)
      return td_why(why, n, TD_EPROTO, "update echoing a set signature of %zu bytes (one has %d)",
                    e->update->applied_signature.len, TD_WIRE_SIGNATURE_BYTES);
    return check_chunk(e->update->chunk, e->update->chunks, e->update->total_bytes,
                       e->update->payload.len, why, n);
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK:
    if (e->snapshot_chunk->payload.len > TD_WIRE_MAX_CHUNK ||
        e->snapshot_chunk->total_bytes > TD_WIRE_MAX_TRANSFER ||
        e->snapshot_chunk->offset > e->snapshot_chunk->total_bytes ||
        e->snapshot_chunk->payload.len >
            e->snapshot_chunk->total_bytes - e->snapshot_chunk->offset)
      return td_why(why, n, TD_EPROTO, "snapshot chunk out of range");
    return 0;
  case TRAIND__ENVELOPE__BODY_STATE_HASH: /* a hash, or empty for a request */
    if (e->state_hash->hash.len != 0 && e->state_hash->hash.len != TD_WIRE_STATE_HASH_BYTES)
      return td_why(why, n, TD_EPROTO, "state hash of %zu bytes (a hash has %d)",
                    e->state_hash->hash.len, TD_WIRE_STATE_HASH_BYTES);
    return 0;
  case TRAIND__ENVELOPE__BODY_ROUND_CLOSE:
    if (e->round_close->round == 0 || e->round_close->members == 0)
      return td_why(why, n, TD_EPROTO, "round close without a round or a member");
    if (e->round_close->signature.len != 0 &&
        e->round_close->signature.len != TD_WIRE_SIGNATURE_BYTES)
      return td_why(why, n, TD_EPROTO, "round close signature of %zu bytes (one has %d)",
                    e->round_close->signature.len, TD_WIRE_SIGNATURE_BYTES);
    if (e->round_close->digests.len !=
        (e->round_close->digests.len == 0
             ? 0
             : (size_t)__builtin_popcountll(e->round_close->members) * TD_WIRE_DIGEST_BYTES))
      return td_why(why, n, TD_EPROTO, "round close with %zu bytes of digests for %d members "
                    "(%d bytes each)", e->round_close->digests.len,
                    __builtin_popcountll(e->round_close->members), TD_WIRE_DIGEST_BYTES);
    if ((e->round_close->digests.len == 0) !=
        (e->round_close->digests_signature.len == 0) ||
        (e->round_close->digests_signature.len != 0 &&
         e->round_close->digests_signature.len != TD_WIRE_SIGNATURE_BYTES))
      return td_why(why, n, TD_EPROTO, "round close digests without their signature, or a "
                    "signature of %zu bytes", e->round_close->digests_signature.len);
    return 0;
  case TRAIND__ENVELOPE__BODY_UPDATE_REQUEST:
    if (e->update_request->round == 0 ||
        (e->update_request->member == 0) != e->update_request->close)
      return td_why(why, n, TD_EPROTO, "update request without a round, or with neither a "
                    "member nor the close (or both)");
    return 0;
  case TRAIND__ENVELOPE__BODY_RELAY:
    if (e->relay->signature.len != TD_WIRE_SIGNATURE_BYTES || e->relay->inner.len == 0 ||
        e->relay->inner.len > TD_WIRE_MAX_RELAYED || e->relay->origin == 0 ||
        e->relay->target == 0 || e->relay->seq == 0)
      return td_why(why, n, TD_EPROTO, "relay without origin, target, sequence number, a %d-byte signature or "
                    "an inner message of 1..%u bytes", TD_WIRE_SIGNATURE_BYTES,
                    TD_WIRE_MAX_RELAYED);
    return 0;
  case TRAIND__ENVELOPE__BODY_ACK:
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST:
  case TRAIND__ENVELOPE__BODY_EVAL_REPORT:
    return 0;
  case TRAIND__ENVELOPE__BODY__NOT_SET:
  default:
    return td_why(why, n, TD_EPROTO, "message without a body");
  }
}

int td_wire_unpack(Traind__Envelope **out, const uint8_t *buf, size_t len, char *why,
                   size_t why_len) {
  td_wire_refusal_t refusal;
  return td_wire_unpack_peer(out, buf, len, &refusal, why, why_len);
}

int td_wire_unpack_peer(Traind__Envelope **out, const uint8_t *buf, size_t len,
                        td_wire_refusal_t *refusal, char *why, size_t why_len) {
  *out = NULL;
  *refusal = TD_WIRE_MALFORMED;
  if (len > TD_WIRE_MAX_MESSAGE)
    return td_why(why, why_len, TD_EPROTO, "message of %zu bytes (limit %u)", len,
                  TD_WIRE_MAX_MESSAGE);
  Traind__Envelope *e = traind__envelope__unpack(NULL, len, buf);
  if (e == NULL)
    return td_why(why, why_len, TD_EPROTO, "undecodable message of %zu bytes", len);
  int rc = validate(e, why, why_len);
  if (rc != 0) {
    if (e->version != TD_WIRE_VERSION)
      *refusal = TD_WIRE_BAD_VERSION;
    traind__envelope__free_unpacked(e, NULL);
    return rc;
  }
  *out = e;
  return 0;
}

void td_wire_free(Traind__Envelope **env_p) {
  if (env_p == NULL || *env_p == NULL)
    return;
  traind__envelope__free_unpacked(*env_p, NULL);
  *env_p = NULL;
}

int td_wire_pack_request(Traind__ControlRequest *req, uint8_t **out, size_t *len) {
  req->version = TD_WIRE_VERSION;
  return pack_common(&req->base, TD_WIRE_MAX_CONTROL, out, len);
}

int td_wire_unpack_request(Traind__ControlRequest **out, const uint8_t *buf, size_t len,
                           char *why, size_t why_len) {
  *out = NULL;
  if (len > TD_WIRE_MAX_CONTROL)
    return td_why(why, why_len, TD_EPROTO, "control request of %zu bytes (limit %u)", len,
                  TD_WIRE_MAX_CONTROL);
  Traind__ControlRequest *r = traind__control_request__unpack(NULL, len, buf);
  if (r == NULL)
    return td_why(why, why_len, TD_EPROTO, "undecodable control request");
  if (r->version != TD_WIRE_VERSION) {
    int v = (int)r->version;
    traind__control_request__free_unpacked(r, NULL);
    return td_why(why, why_len, TD_EPROTO,
                  "trainctl speaks protocol version %d, traind speaks %d", v, TD_WIRE_VERSION);
  }
  *out = r;
  return 0;
}

void td_wire_free_request(Traind__ControlRequest **req_p) {
  if (req_p == NULL || *req_p == NULL)
    return;
  traind__control_request__free_unpacked(*req_p, NULL);
  *req_p = NULL;
}

int td_wire_pack_response(Traind__ControlResponse *resp, uint8_t **out, size_t *len) {
  resp->version = TD_WIRE_VERSION;
  return pack_common(&resp->base, TD_WIRE_MAX_CONTROL, out, len);
}

int td_wire_unpack_response(Traind__ControlResponse **out, const uint8_t *buf, size_t len,
                            char *why, size_t why_len) {
  *out = NULL;
  if (len > TD_WIRE_MAX_CONTROL)
    return td_why(why, why_len, TD_EPROTO, "control response of %zu bytes (limit %u)", len,
                  TD_WIRE_MAX_CONTROL);
  Traind__ControlResponse *r = traind__control_response__unpack(NULL, len, buf);
  if (r == NULL)
    return td_why(why, why_len, TD_EPROTO, "undecodable control response");
  if (r->version != TD_WIRE_VERSION) {
    int v = (int)r->version;
    traind__control_response__free_unpacked(r, NULL);
    return td_why(why, why_len, TD_EPROTO,
                  "traind speaks protocol version %d, trainctl speaks %d", v, TD_WIRE_VERSION);
  }
  *out = r;
  return 0;
}

void td_wire_free_response(Traind__ControlResponse **resp_p) {
  if (resp_p == NULL || *resp_p == NULL)
    return;
  traind__control_response__free_unpacked(*resp_p, NULL);
  *resp_p = NULL;
}

const char *td_wire_body_name(const Traind__Envelope *env) {
  switch (env->body_case) {
  case TRAIND__ENVELOPE__BODY_HELLO: return "hello";
  case TRAIND__ENVELOPE__BODY_WELCOME: return "welcome";
  case TRAIND__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
  case TRAIND__ENVELOPE__BODY_LEAVE: return "leave";
  case TRAIND__ENVELOPE__BODY_UPDATE: return "update";
  case TRAIND__ENVELOPE__BODY_ACK: return "ack";
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_REQUEST: return "snapshot_request";
  case TRAIND__ENVELOPE__BODY_SNAPSHOT_CHUNK: return "snapshot_chunk";
  case TRAIND__ENVELOPE__BODY_EVAL_REPORT: return "eval_report";
  case TRAIND__ENVELOPE__BODY_RUN_START: return "run_start";
  case TRAIND__ENVELOPE__BODY_RUN_STOP: return "run_stop";
  case TRAIND__ENVELOPE__BODY_RUN_REFUSED: return "run_refused";
  case TRAIND__ENVELOPE__BODY_ADMISSIONS: return "admissions";
  case TRAIND__ENVELOPE__BODY_JOIN_REQUEST: return "join_request";
  case TRAIND__ENVELOPE__BODY_JOIN_GRANT: return "join_grant";
  case TRAIND__ENVELOPE__BODY_STATE_HASH: return "state_hash";
  case TRAIND__ENVELOPE__BODY_RELAY: return "relay";
  case TRAIND__ENVELOPE__BODY_ROUND_CLOSE: return "round_close";
  case TRAIND__ENVELOPE__BODY_UPDATE_REQUEST: return "update_request";
  default: return "none";
  }
}
