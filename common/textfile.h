/* textfile.h: reading a small text file whole, as a hostile input: a regular
 * file, bounded in size, with no NUL byte. Run files (trainctl start FILE,
 * traind --standalone FILE) are read this way. */
#ifndef TD_COMMON_TEXTFILE_H
#define TD_COMMON_TEXTFILE_H

#include <stddef.h>

/* Read `path` whole into *text, NUL-terminated (caller frees). `what` names
 * the kind of file in errors ("a run file"). TD_ENOENT or TD_EIO when it
 * cannot be opened or read; TD_ECONFIG for a directory or other non-file, a
 * file over max_bytes, or a NUL byte (with its line: what follows it would
 * be dropped unseen); TD_ENOMEM. *text is NULL on error. */
int td_textfile_read(const char *path, size_t max_bytes, const char *what, char **text,
                     char *why, size_t why_len);

#endif
