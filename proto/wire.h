/* wire.h: the one place where peer and control messages are packed and unpacked.
 *
 * Messages are protobuf-c structures generated from proto/traind.proto at build
 * time. Nothing that arrives from a socket is trusted: td_wire_unpack() refuses
 * a buffer over the size limit before protobuf-c allocates anything, then checks
 * the version, that a body is present, and every count, length and index in it
 * against the limits below, and answers TD_EPROTO with a one-line reason. The
 * caller counts and logs the drop; nothing here asserts on input. */
#ifndef TD_WIRE_H
#define TD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/limits.h"
#include "proto/traind.pb-c.h"

#define TD_WIRE_VERSION 5
/* Largest envelope accepted on a peer socket. */
#define TD_WIRE_MAX_MESSAGE (1u << 20)
/* Largest payload in one UpdateChunk / SnapshotChunk (docs/design.md#links-and-channels). */
#define TD_WIRE_MAX_CHUNK TD_CHUNK_BYTES
/* Largest whole update or snapshot, and chunks per transfer. */
#define TD_WIRE_MAX_TRANSFER (1ull << 32)
#define TD_WIRE_MAX_CHUNKS (1u << 20)
/* Peers in one peer list (welcome, heartbeat): the cluster. */
#define TD_WIRE_MAX_PEERS TD_MAX_NODES
/* Members of one run (RunStart) and capacities an update echoes. */
#define TD_WIRE_MAX_RUN_MEMBERS TD_MAX_RUN_MEMBERS
#define TD_WIRE_MAX_STRING 256
#define TD_WIRE_MAX_SPEC 16384
/* Signed admission records in one message, and the size of each
 * (daemon/net/admission.h); keys and signatures in a join request. */
#define TD_WIRE_MAX_RECORDS 512
#define TD_WIRE_RECORD_BYTES 174
#define TD_WIRE_KEY_BYTES 32
#define TD_WIRE_SIGNATURE_BYTES 64
/* An update digest in a RoundClose (BLAKE2b-256). */
#define TD_WIRE_DIGEST_BYTES 32
/* StateHash.hash: BLAKE2b-256 (scheduler/agree.h) */
#define TD_WIRE_STATE_HASH_BYTES 32
/* Largest message one node relays for another (its Relay wrapper must still
 * fit TD_WIRE_MAX_MESSAGE). */
#define TD_WIRE_MAX_RELAYED (TD_WIRE_MAX_MESSAGE - 256u)
/* Largest control message (trainctl <-> traind). */
#define TD_WIRE_MAX_CONTROL (4u << 20)

/* Serialise an envelope, setting its version. Caller owns *out (free()). */
int td_wire_pack(Traind__Envelope *env, uint8_t **out, size_t *len);
/* Parse and validate an envelope. Caller owns *out and releases it with
 * td_wire_free(). TD_EPROTO + why for anything malformed or out of limits. */
int td_wire_unpack(Traind__Envelope **out, const uint8_t *buf, size_t len, char *why,
                   size_t why_len);
void td_wire_free(Traind__Envelope **env_p);
/* td_wire_unpack() for the peer socket: *refusal also says whether a refused
 * message spoke another protocol version (counted apart from malformed ones). */
typedef enum { TD_WIRE_MALFORMED = 0, TD_WIRE_BAD_VERSION } td_wire_refusal_t;
int td_wire_unpack_peer(Traind__Envelope **out, const uint8_t *buf, size_t len,
                        td_wire_refusal_t *refusal, char *why, size_t why_len);

/* The same pair for control messages. */
int td_wire_pack_request(Traind__ControlRequest *req, uint8_t **out, size_t *len);
int td_wire_unpack_request(Traind__ControlRequest **out, const uint8_t *buf, size_t len,
                           char *why, size_t why_len);
void td_wire_free_request(Traind__ControlRequest **req_p);
int td_wire_pack_response(Traind__ControlResponse *resp, uint8_t **out, size_t *len);
int td_wire_unpack_response(Traind__ControlResponse **out, const uint8_t *buf, size_t len,
                            char *why, size_t why_len);
void td_wire_free_response(Traind__ControlResponse **resp_p);

/* Name of an envelope body ("heartbeat", "update", ...) for logs and counters. */
const char *td_wire_body_name(const Traind__Envelope *env);

#endif
