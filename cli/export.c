/* export.c: trainctl export RUN [--format csv|json] [--table T]: a run's rows.
 *
 * Writes the rounds, updates, links and events rows of one run (one ledger)
 * exactly as SQLite holds them, ids shown as the daemon logs them (16 hex
 * digits, reals in their shortest round-trip form), as CSV (one table,
 * header line first) or JSON (every table). The ledger is opened read-only
 * through cli/ledgers.h. `trainctl rounds --csv` prints its rounds through
 * here too, so both have the same columns. A reader that closes the pipe
 * (`| head`) ends the export quietly. Runs on trainctl's only thread. */
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/export.h"
#include "cli/ledgers.h"
#include "common/numfmt.h"

static const char *const TABLES[] = {"rounds", "updates", "links", "events"};
#define N_TABLES (sizeof TABLES / sizeof TABLES[0])

static void csv_field(FILE *out, const char *s) {
  if (strpbrk(s, ",\"\n\r") == NULL) {
    fputs(s, out);
    return;
  }
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

/* Node and run ids read as their hex form, the rest as SQLite gives them. */
static bool is_id_column(const char *name) {
  return strcmp(name, "run_id") == 0 || strcmp(name, "peer") == 0;
}

/* The rows of TABLE for run r, into out as CSV or into arr as objects; for
 * rounds, the last `last` of them (0: all). */
static int dump_table(const td__ledgers_run_t *r, const char *table, unsigned last, FILE *out,
                      json_object *arr) {
  char sql[512];
  if (strcmp(table, "events") == 0)
    snprintf(sql, sizeof sql,
             "SELECT * FROM events WHERE (at >= ?2 AND at <= ?3) OR instr(detail, ?4) > 0"
             " ORDER BY id");
  else if (strcmp(table, "rounds") == 0 && last > 0)
    snprintf(sql, sizeof sql,
             "SELECT * FROM (SELECT * FROM rounds WHERE run_id = ?1 ORDER BY round DESC"
             " LIMIT %u) ORDER BY round", last);
  else
    snprintf(sql, sizeof sql, "SELECT * FROM %s WHERE run_id = ?1 ORDER BY %s", table,
             strcmp(table, "rounds") == 0 ? "round" : "id");
  sqlite3 *db = r->ledger->db;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, r->run_id);
  sqlite3_bind_double(st, 2, r->started);
  sqlite3_bind_double(st, 3, isnan(r->ended) ? INFINITY : r->ended);
  char needle[32];
  snprintf(needle, sizeof needle, "run %s", r->id);
  sqlite3_bind_text(st, 4, needle, -1, SQLITE_TRANSIENT);
  int cols = sqlite3_column_count(st);
  if (out != NULL) {
    for (int c = 0; c < cols; c++) {
      fputs(c ? "," : "", out);
      csv_field(out, sqlite3_column_name(st, c));
    }
    fputc('\n', out);
  }
  int s;
  while ((out == NULL || !ferror(out)) && (s = sqlite3_step(st)) == SQLITE_ROW) {
    json_object *row = arr ? json_object_new_object() : NULL;
    for (int c = 0; c < cols; c++) {
      const char *name = sqlite3_column_name(st, c);
      int type = sqlite3_column_type(st, c);
      char idbuf[17], numbuf[40];
      const char *text = NULL;
      json_object *jv = NULL;
      if (type == SQLITE_NULL) {
        text = "";
      } else if (is_id_column(name) && type == SQLITE_INTEGER) {
        snprintf(idbuf, sizeof idbuf, "%016" PRIx64, (uint64_t)sqlite3_column_int64(st, c));
        text = idbuf;
        jv = json_object_new_string(idbuf);
      } else if (type == SQLITE_INTEGER) {
        text = (const char *)sqlite3_column_text(st, c);
        jv = json_object_new_int64(sqlite3_column_int64(st, c));
      } else if (type == SQLITE_FLOAT) {
        text = td_numfmt_exact(numbuf, sizeof numbuf, sqlite3_column_double(st, c));
        jv = json_object_new_double(sqlite3_column_double(st, c));
      } else {
        text = (const char *)sqlite3_column_text(st, c);
        jv = json_object_new_string(text ? text : "");
      }
      if (out != NULL) {
        fputs(c ? "," : "", out);
        csv_field(out, text ? text : "");
      }
      if (row != NULL)
        json_object_object_add(row, name, jv);
      else
        json_object_put(jv);
    }
    if (out != NULL)
      fputc('\n', out);
    if (arr != NULL)
      json_object_array_add(arr, row);
  }
  int rc = (out != NULL && ferror(out)) || s == SQLITE_DONE
               ? 0 /* a write error is the caller's to report */
               : td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return rc;
}

int td_export_main(int argc, char **argv) {
  static const char use[] = "trainctl export RUN [--format csv|json] "
                            "[--table rounds|updates|links|events] [--db FILE | --data-dir DIR]...";
  td__ledgers_set_t set = {0};
  const char *arg = NULL, *format = "csv", *table = NULL;
  int rc = 0;
  for (int a = 0; a < argc && rc == 0; a++) {
    int t = td__ledgers_take_db_opt(&set, argc, argv, &a);
    if (t < 0)
      rc = 1;
    else if (t == 1)
      continue;
    else if (strcmp(argv[a], "--format") == 0 && a + 1 < argc)
      format = argv[++a];
    else if (strncmp(argv[a], "--format=", 9) == 0)
      format = argv[a] + 9;
    else if (strcmp(argv[a], "--table") == 0 && a + 1 < argc)
      table = argv[++a];
    else if (strncmp(argv[a], "--table=", 8) == 0)
      table = argv[a] + 8;
    else if (argv[a][0] != '-' && arg == NULL)
      arg = argv[a];
    else
      rc = td__ledgers_usage(use);
  }
  if (rc == 0 && arg == NULL)
    rc = td__ledgers_usage(use);
  if (rc == 0 && strcmp(format, "csv") != 0 && strcmp(format, "json") != 0)
    rc = td__ledgers_usage(use);
  bool table_ok = table == NULL;
  for (size_t i = 0; !table_ok && i < N_TABLES; i++)
    table_ok = strcmp(table, TABLES[i]) == 0;
  if (rc == 0 && !table_ok) {
    fprintf(stderr, "trainctl: error: unknown table '%s' (rounds, updates, links, events)\n",
            table);
    rc = 2;
  }
  td__ledgers_run_t *r = NULL;
  if (rc == 0)
    rc = td__ledgers_one_run(&set, arg, &r);
  if (rc == 0 && strcmp(format, "json") == 0) {
    json_object *o = NULL, *run = NULL;
    if ((rc = td__ledgers_run_summary(r, &run)) == 0) {
      o = json_object_new_object();
      json_object_object_add(o, "run", run);
    }
    for (size_t i = 0; rc == 0 && i < N_TABLES; i++) {
      if (table != NULL && strcmp(table, TABLES[i]) != 0)
        continue;
      json_object *arr = json_object_new_array();
      json_object_object_add(o, TABLES[i], arr);
      rc = dump_table(r, TABLES[i], 0, NULL, arr);
    }
    if (rc == 0)
      printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
  } else if (rc == 0) {
    bool first = true;
    for (size_t i = 0; rc == 0 && i < N_TABLES; i++) {
      if (table != NULL && strcmp(table, TABLES[i]) != 0)
        continue;
      if (table == NULL)
        printf("%s# %s\n", first ? "" : "\n", TABLES[i]);
      first = false;
      rc = dump_table(r, TABLES[i], 0, stdout, NULL);
    }
  }
  /* a write error on stdout (a closed pipe is none) is trainctl's main's to report */
  td__ledgers_runs_free(r, r ? 1 : 0);
  td__ledgers_close(&set);
  return rc;
}

int td_export_rounds_csv(const char *data_dir, const char *run_hex, unsigned last) {
  td__ledgers_set_t set = {0};
  if (td__ledgers_add(&set, data_dir) < 0)
    return 1;
  /* by id alone: the run's row may still be on its way to the ledger */
  td__ledgers_run_t run = {.ledger = set.dbs[0], .started = NAN, .ended = NAN};
  if (run_hex != NULL)
    run.run_id = (int64_t)strtoull(run_hex, NULL, 16);
  int rc = dump_table(&run, "rounds", last, stdout, NULL);
  td__ledgers_close(&set);
  return rc;
}
