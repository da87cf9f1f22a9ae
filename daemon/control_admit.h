/* control_admit.h: the control commands that change who belongs: `join`
 * (by key or by invite), `key`, `allow` and `revoke` (control_admit.c).
 * Each answers on the connection it is given, now or once the join is
 * settled. */
#ifndef TD_DAEMON_CONTROL_ADMIT_H
#define TD_DAEMON_CONTROL_ADMIT_H

#include "daemon/control_conn.h"

/* Join the node at `endpoint` (its public `key` on a secure node), or the one
 * an `invite` string names; answers once the welcome or a refusal comes. */
void td__control_cmd_join(conn_t *c, const char *endpoint, const char *key, const char *invite);
/* This node's key and the keys it admits. */
void td__control_cmd_key(conn_t *c);
/* Admit `key` (as admin when `admin`). */
void td__control_cmd_allow(conn_t *c, const char *key, bool admin);
/* Unlist `key` and end its member; an admin spreads the revocation. */
void td__control_cmd_revoke(conn_t *c, const char *key);

#endif
