/* views.h: trainctl's printing of status, peers and rounds (cli/views.c),
 * called by the command table in cli/trainctl.c. Each returns the exit code:
 * 0, or 1 after a one-line error (the daemon refused or did not answer). */
#ifndef TD_CLI_VIEWS_H
#define TD_CLI_VIEWS_H

#include <json-c/json.h>
#include <stdbool.h>

/* `trainctl status`: the node's summary and its peers (json: the answer as it
 * came); watch: one line per change every every_s seconds until the run ends,
 * exit 1 when it failed. */
int td__views_status(bool json, bool watch, double every_s);
/* `trainctl rounds`: the current run's last `last` rounds (0: all) as a table,
 * as JSON, or (csv) as the ledger's own columns. */
int td__views_rounds(unsigned last, bool csv, bool json);
/* The peers' table of an answer's "peers" array (borrowed). */
void td__views_peers(json_object *peers);
/* The run's last state-hash vote (status's "verify"): who agrees, who
 * differs, a repair under way; nothing before the first vote. */
void td__views_verify(json_object *run);

#endif
