/* plot.c: trainctl plot: curves of one or more runs, drawn by gnuplot.
 *
 * Every RUN argument resolves (cli/ledgers.h) to the run in each ledger that
 * holds it; each (run, ledger) pair is one curve, so a run seen by four nodes
 * is four curves. The legend names what tells the curves apart: the run keys
 * whose values differ between the runs' specs ("codec=topk:0.01
 * mode=overlap"), plus the node (its data dir's name) when more than one
 * ledger is drawn, and the node count ("nodes=6") when the runs had
 * different numbers of nodes (the spec does not say it; the ledgers' run_start
 * events and rounds' members do), so runs of a 3-node and a 6-node cluster
 * plotted together can be told apart. --y bytes and bytes_recv are per node
 * per round, in kB, drawn by round unless --x says otherwise. The data go into the gnuplot script itself as datablocks,
 * and the script is kept beside the image (FILE.gp, or --script), so a plot
 * can be restyled and redrawn without the ledgers. --y client_accuracy is the
 * exception: two bands (min to max, 10th to 90th percentile over the
 * clients) and one median line per run, pooled over every ledger named
 * (cli/clients.h). Runs on trainctl's thread. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/clients.h"
#include "cli/ledgers.h"
#include "cli/plot.h"

typedef struct {
  const char *name;
  const char *label; /* axis label */
} axis_t;

static const axis_t X_AXES[] = {
    {"time", "seconds since the run started"},
    {"round", "round"},
    {"samples", "samples trained by the node"},
    {"bytes", "MB sent by the node"},
};
static const axis_t Y_AXES[] = {
    {"accuracy", "evaluation accuracy"},
    {"loss", "training loss"},
    {"bpb", "bits per byte (evaluation)"},
    {"goodput", "link goodput, mean over peers (Mbit/s)"},
    {"staleness", "staleness of received updates, mean (rounds)"},
    {"idle", "compute idle fraction (wait / (compute + wait))"},
    {"bytes", "kB sent by the node in the round"},
    {"bytes_recv", "kB of updates received by the node for the round"},
    {"client_accuracy", "accuracy on each client's held-out share"},
    {"consensus", "consensus distance, the node's estimate (topology gossip, groups)"},
};

static const axis_t *find_axis(const axis_t *axes, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(axes[i].name, name) == 0)
      return &axes[i];
  return NULL;
}

/* The SQL expression of the y metric over `rounds r`; NULL when the ledger
 * has no such column. */
static const char *y_expr(const char *y, const td__ledgers_db_t *d, char *buf, size_t len) {
  if (strcmp(y, "accuracy") == 0)
    return "r.eval_acc";
  if (strcmp(y, "loss") == 0)
    return "r.loss";
  if (strcmp(y, "bytes") == 0)
    return "r.bytes_sent * 1e-3";
  if (strcmp(y, "bytes_recv") == 0)
    return "r.bytes_recv * 1e-3";
  if (strcmp(y, "idle") == 0)
    return "r.wait_s / NULLIF(r.compute_s + r.wait_s, 0)";
  if (strcmp(y, "goodput") == 0)
    return "(SELECT avg(k.goodput_bps) * 8e-6 FROM links k WHERE k.run_id = r.run_id"
           " AND k.round = r.round)";
  if (strcmp(y, "staleness") == 0)
    return "(SELECT avg(u.staleness) FROM updates u WHERE u.run_id = r.run_id"
           " AND u.round = r.round)";
  if (strcmp(y, "consensus") == 0 && d->has_consensus)
    return "r.consensus";
  if (strcmp(y, "bpb") == 0 && d->has_eval_bpb) {
    snprintf(buf, len, "r.\"%s\"", d->bpb_column);
    return buf;
  }
  return NULL;
}

static const char *x_expr(const char *x) {
  if (strcmp(x, "time") == 0)
    return "r.ended - ?2";
  if (strcmp(x, "round") == 0)
    return "r.round";
  if (strcmp(x, "samples") == 0)
    return "sum(r.samples) OVER (ORDER BY r.round)";
  return "sum(r.bytes_sent) OVER (ORDER BY r.round) * 1e-6";
}

/* A spec value as a legend shows it: numbers without %.17g noise. */
static void short_value(const char *v, char *buf, size_t len) {
  char *end;
  double d = strtod(v, &end);
  if (v[0] != '\0' && *end == '\0' && strpbrk(v, ".eE") != NULL && isfinite(d))
    snprintf(buf, len, "%g", d);
  else
    snprintf(buf, len, "%.*s", (int)len - 1, v);
}

/* Append " key=value" for every key whose value differs between the specs,
 * then "nodes=N" when the runs' node counts (nodes[i], 0: unknown) differ. */
static void legend_titles(td__ledgers_run_t *s, size_t n, const unsigned *nodes, bool by_node,
                          char (*titles)[512]) {
  for (size_t i = 0; i < n; i++)
    titles[i][0] = '\0';
  /* keys in the order of the first spec that has them */
  for (size_t i = 0; i < n; i++) {
    for (const char *p = s[i].spec; p && *p;) {
      const char *eol = strchr(p, '\n');
      size_t line = eol ? (size_t)(eol - p) : strlen(p);
      const char *eq = strstr(p, " = ");
      if (eq != NULL && (size_t)(eq - p) < line && eq - p < 64) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        bool seen = false; /* already handled with an earlier spec */
        char v[TD__LEDGERS_VALUE_MAX];
        for (size_t j = 0; j < i && !seen; j++)
          seen = td__ledgers_spec_get(s[j].spec, key, v, sizeof v);
        bool differs = false;
        char first[TD__LEDGERS_VALUE_MAX];
        td__ledgers_spec_get(s[i].spec, key, first, sizeof first);
        for (size_t j = 0; j < n && !seen && !differs; j++) {
          bool has = td__ledgers_spec_get(s[j].spec, key, v, sizeof v);
          differs = !has || strcmp(v, first) != 0;
        }
        for (size_t j = 0; differs && !seen && j < n; j++) {
          char sv[128];
          if (td__ledgers_spec_get(s[j].spec, key, v, sizeof v))
            short_value(v, sv, sizeof sv);
          else
            snprintf(sv, sizeof sv, "-");
          size_t used = strlen(titles[j]);
          snprintf(titles[j] + used, 512 - used, "%s%s=%s", used ? " " : "", key, sv);
        }
      }
      p = eol ? eol + 1 : NULL;
    }
  }
  bool nodes_differ = false;
  for (size_t i = 1; i < n; i++)
    nodes_differ |= nodes[i] != nodes[0];
  for (size_t i = 0; nodes_differ && i < n; i++) {
    size_t used = strlen(titles[i]);
    if (nodes[i] > 0)
      snprintf(titles[i] + used, 512 - used, "%snodes=%u", used ? " " : "", nodes[i]);
    else
      snprintf(titles[i] + used, 512 - used, "%snodes=-", used ? " " : "");
  }
  for (size_t i = 0; i < n; i++) {
    size_t used = strlen(titles[i]);
    if (by_node)
      snprintf(titles[i] + used, 512 - used, "%snode %s", used ? ", " : "", s[i].ledger->label);
    else if (used == 0)
      snprintf(titles[i], 512, "run %.8s", s[i].id);
  }
  /* two curves with one title (same spec, different runs): name the runs */
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (strcmp(titles[i], titles[j]) == 0 && s[i].run_id != s[j].run_id) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%.470s (run %.8s)", titles[j], s[j].id);
        memcpy(titles[j], tmp, sizeof tmp);
      }
}

/* A gnuplot double-quoted string. */
static void gp_quoted(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* A gnuplot single-quoted string (no escapes but '' for '). */
static void gp_single(FILE *f, const char *s) {
  fputc('\'', f);
  for (; *s; s++) {
    if (*s == '\'')
      fputc('\'', f);
    fputc(*s, f);
  }
  fputc('\'', f);
}

/* Write series `idx`'s points as datablock $sIDX; returns how many. */
static int write_series(FILE *gp, const td__ledgers_run_t *r, size_t idx, const char *x,
                        const char *y, long *points) {
  char ybuf[96], sql[1024];
  const char *ye = y_expr(y, r->ledger, ybuf, sizeof ybuf);
  *points = 0;
  if (ye == NULL)
    return td__ledgers_err("run %s (%s) has no %s metric", r->id, r->ledger->label, y);
  snprintf(sql, sizeof sql,
           "SELECT px, py FROM (SELECT r.round AS pr, %s AS px, %s AS py FROM rounds r"
           " WHERE r.run_id = ?1) WHERE py IS NOT NULL AND px IS NOT NULL ORDER BY pr",
           x_expr(x), ye);
  sqlite3 *db = r->ledger->db;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
    return td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, r->run_id);
  if (strcmp(x, "time") == 0)
    sqlite3_bind_double(st, 2, r->started);
  fprintf(gp, "$s%zu << EOD\n", idx);
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
    fprintf(gp, "%.10g %.10g\n", sqlite3_column_double(st, 0), sqlite3_column_double(st, 1));
    (*points)++;
  }
  fprintf(gp, "EOD\n");
  int rc = s == SQLITE_DONE ? 0 : td__ledgers_err("%s: %s", r->ledger->path, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  if (rc == 0 && *points == 0)
    rc = td__ledgers_err("run %s (%s) has no %s metric", r->id, r->ledger->label, y);
  return rc;
}

/* Run gnuplot on SCRIPT; its first line of complaint becomes ours. */
static int run_gnuplot(const char *script) {
  int errpipe[2];
  if (pipe(errpipe) != 0)
    return td__ledgers_err("pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(errpipe[0]);
    close(errpipe[1]);
    return td__ledgers_err("fork: %s", strerror(errno));
  }
  if (pid == 0) {
    dup2(errpipe[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      dup2(devnull, STDOUT_FILENO);
    }
    close(errpipe[0]);
    close(errpipe[1]);
    execlp("gnuplot", "gnuplot", script, (char *)NULL);
    _exit(127);
  }
  close(errpipe[1]);
  char msg[512] = "";
  size_t used = 0;
  ssize_t got;
  char sink[256];
  while ((got = read(errpipe[0], used < sizeof msg - 1 ? msg + used : sink,
                     used < sizeof msg - 1 ? sizeof msg - 1 - used : sizeof sink)) > 0 ||
         (got < 0 && errno == EINTR))
    if (got > 0 && used < sizeof msg - 1)
      used += (size_t)got;
  msg[used] = '\0';
  close(errpipe[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    return td__ledgers_err("gnuplot not found in PATH: install the Debian package gnuplot-nox "
                        "(apt-get install gnuplot-nox); the script is in %s", script);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    /* the last non-empty line says what went wrong */
    char *line = NULL;
    for (char *p = strtok(msg, "\n"); p; p = strtok(NULL, "\n"))
      if (strspn(p, " \t^") != strlen(p))
        line = p;
    return td__ledgers_err("gnuplot failed on %s: %s", script, line ? line : "no message");
  }
  return 0;
}

static int usage_err(void) {
  fprintf(stderr, "trainctl: error: usage: trainctl plot RUN... [--x time|round|samples|bytes]"
                  " [--y accuracy|loss|bpb|goodput|staleness|idle|bytes|bytes_recv|consensus|"
                  "client_accuracy]"
                  " [-o FILE.png|FILE.svg]"
                  " [--script FILE.gp] [--size WxH] [--db FILE | --data-dir DIR]...\n");
  return 2;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

int td_plot_main(int argc, char **argv) {
  td__ledgers_set_t set = {0};
  const char *x = NULL, *y = "accuracy", *out = NULL, *script = NULL;
  unsigned width = 900, height = 560;
  const char **args = calloc((size_t)argc + 1, sizeof *args);
  size_t nargs = 0;
  int rc = args ? 0 : td__ledgers_err("out of memory");
  for (int a = 0; a < argc && rc == 0; a++) {
    const char *o = argv[a];
    bool has_next = a + 1 < argc;
    if ((strcmp(o, "--db") == 0 || strcmp(o, "--data-dir") == 0) && has_next) {
      rc = td__ledgers_add(&set, argv[++a]) < 0 ? 1 : 0;
    } else if (strcmp(o, "--x") == 0 && has_next) {
      x = argv[++a];
    } else if (strcmp(o, "--y") == 0 && has_next) {
      y = argv[++a];
    } else if (strcmp(o, "-o") == 0 && has_next) {
      out = argv[++a];
    } else if (strcmp(o, "--script") == 0 && has_next) {
      script = argv[++a];
    } else if (strcmp(o, "--size") == 0 && has_next) {
      char tail;
      if (sscanf(argv[++a], "%ux%u%c", &width, &height, &tail) != 2 || width < 100 ||
          height < 100 || width > 10000 || height > 10000) {
        fprintf(stderr, "trainctl: error: --size WxH needs two integers in [100, 10000]\n");
        rc = 2;
      }
    } else if (o[0] != '-') {
      args[nargs++] = o;
    } else {
      rc = usage_err();
    }
  }
  if (rc == 0 && nargs == 0)
    rc = usage_err();
  /* bytes per round read best by round; every other metric over time */
  if (x == NULL)
    x = strcmp(y, "bytes") == 0 || strcmp(y, "bytes_recv") == 0 || strcmp(y, "consensus") == 0
            ? "round"
            : "time";
  if (rc == 0 && find_axis(X_AXES, sizeof X_AXES / sizeof X_AXES[0], x) == NULL) {
    fprintf(stderr, "trainctl: error: --x '%s' (accepted: time, round, samples, bytes)\n", x);
    rc = 2;
  }
  if (rc == 0 && find_axis(Y_AXES, sizeof Y_AXES / sizeof Y_AXES[0], y) == NULL) {
    fprintf(stderr, "trainctl: error: --y '%s' (accepted: accuracy, loss, bpb, goodput, "
                    "staleness, idle, bytes, bytes_recv, client_accuracy, consensus)\n", y);
    rc = 2;
  }
  /* the clients' spread: min, median and max over the clients of each round */
  bool spread = rc == 0 && strcmp(y, "client_accuracy") == 0;
  if (spread && strcmp(x, "round") != 0) {
    fprintf(stderr, "trainctl: error: --y client_accuracy is drawn by round only: add --x round\n");
    rc = 2;
  }
  if (rc == 0 && out != NULL && !ends_with(out, ".png") && !ends_with(out, ".svg")) {
    fprintf(stderr, "trainctl: error: -o %s: the file name must end in .png or .svg\n", out);
    rc = 2;
  }
  /* every curve: each argument's run in each ledger holding it */
  td__ledgers_run_t *series = NULL;
  size_t n = 0;
  for (size_t i = 0; rc == 0 && i < nargs; i++) {
    td__ledgers_run_t *found;
    size_t nf;
    if ((rc = td__ledgers_resolve(&set, args[i], &found, &nf)) != 0)
      break;
    td__ledgers_run_t *grown = realloc(series, (n + nf) * sizeof *grown);
    if (grown == NULL) {
      td__ledgers_runs_free(found, nf);
      rc = td__ledgers_err("out of memory");
      break;
    }
    series = grown;
    for (size_t j = 0; j < nf; j++) {
      bool dup = false; /* the same run and ledger named twice: one curve */
      for (size_t k = 0; k < n && !dup; k++)
        dup = series[k].run_id == found[j].run_id && series[k].ledger == found[j].ledger;
      if (dup)
        free(found[j].spec);
      else
        series[n++] = found[j];
    }
    free(found);
  }
  char default_out[64], script_path[1100];
  if (rc == 0 && out == NULL) {
    snprintf(default_out, sizeof default_out, "%.8s-%s.png", series[0].id, y);
    out = default_out;
  }
  if (rc == 0) {
    if (script != NULL)
      snprintf(script_path, sizeof script_path, "%s", script);
    else
      snprintf(script_path, sizeof script_path, "%.*s.gp", (int)strlen(out) - 4, out);
  }
  char(*titles)[512] = rc == 0 ? calloc(n, sizeof *titles) : NULL;
  unsigned *nodes = rc == 0 ? calloc(n, sizeof *nodes) : NULL;
  if (rc == 0 && (titles == NULL || nodes == NULL))
    rc = td__ledgers_err("out of memory");
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = td__ledgers_run_nodes(&series[i], &nodes[i]);
  FILE *gp = NULL;
  if (rc == 0 && (gp = fopen(script_path, "w")) == NULL)
    rc = td__ledgers_err("cannot write %s: %s", script_path, strerror(errno));
  if (rc == 0) {
    bool by_node = false;
    for (size_t i = 1; i < n; i++)
      by_node |= series[i].ledger != series[0].ledger;
    legend_titles(series, n, nodes, by_node, titles);
    const axis_t *xa = find_axis(X_AXES, sizeof X_AXES / sizeof X_AXES[0], x);
    const axis_t *ya = find_axis(Y_AXES, sizeof Y_AXES / sizeof Y_AXES[0], y);
    fprintf(gp, "# trainctl plot --x %s --y %s: %zu curve(s)\n", x, y, n);
    for (size_t i = 0; i < n; i++)
      fprintf(gp, "# curve %zu: run %s in %s\n", i + 1, series[i].id, series[i].ledger->path);
    size_t *spread_runs = spread ? calloc(n, sizeof *spread_runs) : NULL, blocks = 0;
    if (spread && spread_runs == NULL)
      rc = td__ledgers_err("out of memory");
    if (spread && rc == 0)
      rc = td__clients_write_spread(gp, series, n, spread_runs, &blocks);
    for (size_t i = 0; !spread && rc == 0 && i < n; i++) {
      long points;
      rc = write_series(gp, &series[i], i, x, y, &points);
    }
    if (ends_with(out, ".svg"))
      fprintf(gp, "set terminal svg size %u,%u dynamic noenhanced font 'sans,12'\n", width,
              height);
    else
      fprintf(gp, "set terminal pngcairo size %u,%u noenhanced font 'sans,10'\n", width, height);
    fprintf(gp, "set output ");
    gp_single(gp, out);
    fprintf(gp, "\nset title ");
    char title[256];
    snprintf(title, sizeof title, "%s by %s", y, x);
    gp_quoted(gp, title);
    fprintf(gp, "\nset xlabel ");
    gp_quoted(gp, xa->label);
    fprintf(gp, "\nset ylabel ");
    gp_quoted(gp, ya->label);
    /* the legend below the chart: long titles never hide a curve */
    fprintf(gp, "\nset grid\nset key below box spacing 1.2\n");
    /* room under the x label for a legend of up to one row per curve */
    fprintf(gp, "set bmargin %zu\n", 5 + (n < 10 ? n : 10));
    if (strcmp(y, "idle") == 0)
      fprintf(gp, "set yrange [-0.02:1.05]\n");
    /* bytes from zero, the highest curve clear of the border */
    if (strcmp(y, "bytes") == 0 || strcmp(y, "bytes_recv") == 0)
      fprintf(gp, "set yrange [0:*]\nset offsets 0, 0, graph 0.05, 0\n");
    /* gnuplot draws an empty legend when an entry is wider than the chart
     * by its own estimate (about 9 px a character at 10 pt, 11 at 12 pt,
     * plus the sample line): cut long titles to what fits */
    size_t fit = width > 320 ? (width - 140) / (ends_with(out, ".svg") ? 11 : 9) : 20;
    if (fit > 511)
      fit = 511;
    fprintf(gp, "plot ");
    for (size_t k = 0; k < blocks; k++) { /* a band from min to max and the median */
      char title[600];
      size_t first = spread_runs[k];
      /* the run's own title, without the node a curve per ledger would name */
      snprintf(title, sizeof title, "%.500s", titles[first]);
      char *node = by_node ? strstr(title, "node ") : NULL;
      if (node != NULL)
        *(node > title + 1 && node[-1] == ' ' && node[-2] == ',' ? node - 2 : node) = '\0';
      if (title[0] == '\0')
        snprintf(title, sizeof title, "run %.8s", series[first].id);
      char band[700], inner[700], median[700];
      snprintf(band, sizeof band, "%.80s: clients min to max", title);
      snprintf(inner, sizeof inner, "%.80s: 10th to 90th percentile", title);
      snprintf(median, sizeof median, "%.80s: median client", title);
      fprintf(gp, "%s$c%zu using 1:2:4 with filledcurves fillstyle transparent solid 0.15 "
                  "title ", k ? ", \\\n     " : "", k);
      gp_quoted(gp, band);
      fprintf(gp, ", \\\n     $c%zu using 1:6:7 with filledcurves fillstyle transparent solid 0.35 "
                  "title ", k);
      gp_quoted(gp, inner);
      fprintf(gp, ", \\\n     $c%zu using 1:3 with linespoints pointtype 7 pointsize 0.5 title ",
              k);
      gp_quoted(gp, median);
    }
    for (size_t i = 0; !spread && i < n; i++) {
      fprintf(gp, "%s$s%zu using 1:2 with linespoints pointtype 7 pointsize 0.5 title ",
              i ? ", \\\n     " : "", i);
      char cut[512];
      size_t len = strnlen(titles[i], sizeof cut - 1);
      if (len > fit) {
        memcpy(cut, titles[i], fit - 3);
        memcpy(cut + fit - 3, "...", 4);
      } else {
        memcpy(cut, titles[i], len);
        cut[len] = '\0';
      }
      gp_quoted(gp, cut);
    }
    fprintf(gp, "\n");
    free(spread_runs);
  }
  if (gp != NULL && fclose(gp) != 0 && rc == 0)
    rc = td__ledgers_err("cannot write %s: %s", script_path, strerror(errno));
  if (rc == 0)
    rc = run_gnuplot(script_path);
  if (rc == 0 && spread)
    printf("%s: the clients' accuracy spread (min, 10th percentile, median, 90th, max) by round"
           " over %zu ledger(s) (gnuplot script %s)\n", out, n, script_path);
  else if (rc == 0)
    printf("%s: %zu curve(s) of %s by %s (gnuplot script %s)\n", out, n, y, x, script_path);
  free(titles);
  free(nodes);
  td__ledgers_runs_free(series, n);
  free(args);
  td__ledgers_close(&set);
  return rc;
}
