/* keys.h: a node's CURVE key pair and its allowlist of peer keys, as files.
 *
 * Pure file formats, no sockets (daemon/net/access.c puts them to use, ZAP and
 * links). Keys are Curve25519 (libzmq's CURVE), written as Z85 text of 40
 * characters. The key pair lives in DATA_DIR/node.key, mode 0600, made at
 * first start; a key file that others may read is refused, not used:
 *
 *     # traind node key: keep secret
 *     public Z85PUBLICKEY
 *     secret Z85SECRETKEY
 *
 * The allowlist (DATA_DIR/allowed_keys) names the keys that may connect, one
 * a line, `KEY [admin] [# comment]`; `admin` lets that key start and stop
 * runs on this node. Z85 has '#' in its alphabet, so a comment is a line
 * whose first word is "#" (or starts with '#' and is not 40 characters
 * long), or the rest of a line after the key, from a word starting with '#'. A node's id is derived from its public key
 * (td_key_node_id), so an id cannot be claimed without the secret key. */
#ifndef TD_KEYS_H
#define TD_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_KEY_BYTES 32
#define TD_KEY_Z85_LEN 40
#define TD_KEY_FILE "node.key"
#define TD_KEY_PUB_FILE "node.pub"
#define TD_ALLOWLIST_FILE "allowed_keys"
/* Most entries an allowlist holds (a full mesh is 32 nodes; room for spares). */
#define TD_ALLOWLIST_MAX 256

typedef struct {
  char pub[TD_KEY_Z85_LEN + 1], secret[TD_KEY_Z85_LEN + 1];
  uint8_t pub_raw[TD_KEY_BYTES];
} td_keypair_t;

/* Decode a Z85 key of exactly 40 characters into raw; TD_ECONFIG + why
 * (never quoting more than the key's length) on anything else. */
int td_key_decode(const char *z85, uint8_t raw[TD_KEY_BYTES], char *why, size_t why_len);
/* The node id a public key stands for (never 0). */
uint64_t td_key_node_id(const uint8_t raw[TD_KEY_BYTES]);

/* Read DIR/node.key, or make a new pair there (and DIR/node.pub) when there
 * is none. TD_ECONFIG + why when the file is readable by others, malformed,
 * or its public key does not belong to its secret key; TD_EIO when it cannot
 * be written. */
int td_keypair_load_or_create(const char *dir, td_keypair_t *out, char *why, size_t why_len);

typedef struct {
  uint8_t raw[TD_KEY_BYTES];
  char z85[TD_KEY_Z85_LEN + 1];
  uint64_t node_id;
  bool admin;
} td_allowed_key_t;

typedef struct td_allowlist td_allowlist_t;

/* Read the allowlist at `path` (a missing file is an empty list). Refused
 * with TD_ECONFIG + why (file:line) on a bad key, an unknown word, more than
 * TD_ALLOWLIST_MAX entries, or a file others may write. Caller owns *out. */
int td_allowlist_load(td_allowlist_t **out, const char *path, char *why, size_t why_len);
void td_allowlist_close(td_allowlist_t **self_p);
/* Write it back (a temporary file renamed over the old one, mode 0600). */
int td_allowlist_save(const td_allowlist_t *a, char *why, size_t why_len);
/* Add a key, or change the admin mark of a listed one. TD_ECONFIG on a bad
 * key, TD_ERANGE when full. */
int td_allowlist_add(td_allowlist_t *a, const char *z85, bool admin, char *why, size_t why_len);
/* Remove a key; TD_ENOENT when it is not listed. */
int td_allowlist_remove(td_allowlist_t *a, const char *z85);
/* Borrowed until the next call that changes the list; NULL when absent. */
const td_allowed_key_t *td_allowlist_find_raw(const td_allowlist_t *a,
                                              const uint8_t raw[TD_KEY_BYTES]);
const td_allowed_key_t *td_allowlist_find_z85(const td_allowlist_t *a, const char *z85);
const td_allowed_key_t *td_allowlist_find_id(const td_allowlist_t *a, uint64_t node_id);
size_t td_allowlist_count(const td_allowlist_t *a);
const td_allowed_key_t *td_allowlist_at(const td_allowlist_t *a, size_t i);

#endif
