/* control.c: the framing of the local control socket; see control.h. */
#include "proto/control.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/error.h"

size_t td_control_frame_len(const uint8_t hdr[TD_CONTROL_HEADER_BYTES]) {
  return ((size_t)hdr[0] << 24) | ((size_t)hdr[1] << 16) | ((size_t)hdr[2] << 8) | hdr[3];
}

static void put_header(uint8_t *hdr, size_t len) {
  hdr[0] = (uint8_t)(len >> 24);
  hdr[1] = (uint8_t)(len >> 16);
  hdr[2] = (uint8_t)(len >> 8);
  hdr[3] = (uint8_t)len;
}

static int frame(uint8_t *body, size_t len, uint8_t **out, size_t *out_len) {
  if (len > TD_WIRE_MAX_CONTROL) {
    free(body);
    return TD_ERANGE;
  }
  uint8_t *buf = malloc(len + TD_CONTROL_HEADER_BYTES);
  if (buf == NULL) {
    free(body);
    return TD_ENOMEM;
  }
  put_header(buf, len);
  memcpy(buf + TD_CONTROL_HEADER_BYTES, body, len);
  free(body);
  *out = buf;
  *out_len = len + TD_CONTROL_HEADER_BYTES;
  return 0;
}

int td_control_frame_response(Traind__ControlResponse *resp, uint8_t **out, size_t *len) {
  uint8_t *body;
  size_t body_len;
  if (td_wire_pack_response(resp, &body, &body_len) != 0)
    return TD_EPROTO;
  return frame(body, body_len, out, len);
}

/* 0, or -1 with errno (EAGAIN: the timeout passed; 0 bytes: EPIPE). */
static int read_full(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      errno = EPIPE;
    if (r <= 0)
      return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* A failed read or write: a timeout, or `what` went wrong. */
static int io_error(int fd, const char *what, int timeout_ms, char *why, size_t why_len) {
  int e = errno;
  close(fd);
  if (e == EAGAIN || e == EWOULDBLOCK)
    return td_why(why, why_len, TD_EIO, "traind did not answer within %.1f s",
                  timeout_ms / 1000.0);
  return td_why(why, why_len, TD_EIO, "%s", what);
}

int td_control_call(const char *path, Traind__ControlRequest *req, int timeout_ms,
                    Traind__ControlResponse **out, char *why, size_t why_len) {
  *out = NULL;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path)
    return td_why(why, why_len, TD_EINVAL, "socket path too long: %s", path);
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return td_why(why, why_len, TD_EIO, "socket: %s", strerror(errno));
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    close(fd);
    if (e == ENOENT || e == ECONNREFUSED)
      return td_why(why, why_len, TD_ENOENT, "traind is not running (no daemon at %s)", path);
    return td_why(why, why_len, TD_EIO, "cannot reach traind at %s: %s", path, strerror(e));
  }
  uint8_t *body, hdr[TD_CONTROL_HEADER_BYTES];
  size_t len;
  if (td_wire_pack_request(req, &body, &len) != 0 || len > TD_WIRE_MAX_CONTROL) {
    close(fd);
    return td_why(why, why_len, TD_ERANGE, "request too large");
  }
  put_header(hdr, len);
  int rc = write_full(fd, hdr, sizeof hdr) == 0 && write_full(fd, body, len) == 0 ? 0 : -1;
  free(body);
  if (rc != 0 || read_full(fd, hdr, sizeof hdr) != 0)
    return io_error(fd, "traind closed the connection without answering", timeout_ms, why,
                    why_len);
  size_t rlen = td_control_frame_len(hdr);
  if (rlen > TD_WIRE_MAX_CONTROL) {
    close(fd);
    return td_why(why, why_len, TD_EPROTO, "response too large (%zu bytes)", rlen);
  }
  uint8_t *rbuf = malloc(rlen ? rlen : 1);
  if (rbuf == NULL) {
    close(fd);
    return td_why(why, why_len, TD_ENOMEM, "out of memory for a %zu-byte response", rlen);
  }
  if (read_full(fd, rbuf, rlen) != 0) {
    free(rbuf);
    return io_error(fd, "truncated response from traind", timeout_ms, why, why_len);
  }
  close(fd);
  rc = td_wire_unpack_response(out, rbuf, rlen, why, why_len);
  free(rbuf);
  return rc;
}
