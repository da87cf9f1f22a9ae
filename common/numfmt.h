/* numfmt.h: how traind's tools print a double for people.
 *
 * Two forms: the exact one, the fewest significant digits (15, 16 or 17) that
 * read back as the same double, for values a person set or will paste back
 * (a spec's `lr = 0.05`, not 0.050000000000000003; export cells); and the
 * bounded one, for table columns, which never grows past a given width (a
 * diverged loss prints 1.235e+30, not 31 digits). Both write "nan", "inf" or
 * "-inf" for those values. Pure functions, any thread. */
#ifndef TD_NUMFMT_H
#define TD_NUMFMT_H

#include <stddef.h>

/* v in its shortest round-trip form into buf (len >= 32 always fits);
 * returns buf ("" for a NULL or empty buf). */
const char *td_numfmt_exact(char *buf, size_t len, double v);
/* v with `decimals` decimals when that fits in `width` characters, else in
 * %g form with as many significant digits as fit (at least 1); returns buf. */
const char *td_numfmt_bounded(char *buf, size_t len, double v, int decimals, int width);

#endif
