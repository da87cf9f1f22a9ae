/* control_run.h: the control commands about the run: `start`, `stop` and
 * `verify` (control_run.c). Each answers on the connection it is given. */
#ifndef TD_DAEMON_CONTROL_RUN_H
#define TD_DAEMON_CONTROL_RUN_H

#include "daemon/control_conn.h"

/* Start a run of the request's spec here, then on every live member; answers
 * once each member has said ready or refused, or the wait is over. */
void td__control_cmd_start(conn_t *c, const Traind__ControlRequest *req);
/* Stop the running run here and on every member. */
void td__control_cmd_stop(conn_t *c);
/* Ask the members to hash their state a few rounds ahead; answers that round. */
void td__control_cmd_verify(conn_t *c);

#endif
