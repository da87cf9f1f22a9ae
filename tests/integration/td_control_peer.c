/* td_control_peer.c: misbehaving ends of the control socket, for tests.
 *
 *   td_control_peer rude PATH N CMD  N times: connect to the daemon at PATH,
 *                                  send a request (CMD: status or rounds) and
 *                                  close at once, before the answer (the
 *                                  daemon's write then fails with EPIPE; a
 *                                  rounds query over many rows makes sure the
 *                                  client is gone first). Exits 0 when all
 *                                  were sent.
 *   td_control_peer mute PATH      listen at PATH, accept connections, read
 *                                  them and never answer (a hung daemon), until
 *                                  killed.
 *   td_control_peer answer PATH JSON  listen at PATH and answer every request
 *                                  with success and the JSON text (a daemon
 *                                  whose figures a test chooses: a diverged
 *                                  loss), until killed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/control.h"

static int open_socket(const char *path, struct sockaddr_un *addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr->sun_path)
    return -1;
  strcpy(addr->sun_path, path);
  return socket(AF_UNIX, SOCK_STREAM, 0);
}

static int rude(const char *path, int n, const char *cmd) {
  Traind__ControlRequest req = TRAIND__CONTROL_REQUEST__INIT;
  req.command = strcmp(cmd, "rounds") == 0 ? TRAIND__CONTROL_REQUEST__COMMAND__ROUNDS
                                           : TRAIND__CONTROL_REQUEST__COMMAND__STATUS;
  uint8_t *body;
  size_t len;
  if (td_wire_pack_request(&req, &body, &len) != 0)
    return 1;
  uint8_t frame[256];
  if (len + TD_CONTROL_HEADER_BYTES > sizeof frame)
    return 1;
  frame[0] = (uint8_t)(len >> 24);
  frame[1] = (uint8_t)(len >> 16);
  frame[2] = (uint8_t)(len >> 8);
  frame[3] = (uint8_t)len;
  memcpy(frame + TD_CONTROL_HEADER_BYTES, body, len);
  free(body);
  for (int i = 0; i < n; i++) {
    struct sockaddr_un addr;
    int fd = open_socket(path, &addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
      fprintf(stderr, "td_control_peer: connect %s: %s\n", path, strerror(errno));
      return 1;
    }
    if (send(fd, frame, len + TD_CONTROL_HEADER_BYTES, MSG_NOSIGNAL) < 0)
      return 1;
    close(fd);
  }
  return 0;
}

static int mute(const char *path) {
  struct sockaddr_un addr;
  int fd = open_socket(path, &addr);
  unlink(path);
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 8) != 0) {
    fprintf(stderr, "td_control_peer: listen %s: %s\n", path, strerror(errno));
    return 1;
  }
  for (;;) {
    int c = accept(fd, NULL, NULL);
    char buf[4096];
    while (c >= 0 && read(c, buf, sizeof buf) > 0) {
    }
    /* the connection stays open and unanswered until the client gives up */
  }
}

static int answer(const char *path, const char *json) {
  struct sockaddr_un addr;
  int fd = open_socket(path, &addr);
  unlink(path);
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 8) != 0) {
    fprintf(stderr, "td_control_peer: listen %s: %s\n", path, strerror(errno));
    return 1;
  }
  Traind__ControlResponse resp = TRAIND__CONTROL_RESPONSE__INIT;
  resp.json = (char *)json;
  uint8_t *frame;
  size_t len;
  if (td_control_frame_response(&resp, &frame, &len) != 0)
    return 1;
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c < 0)
      continue;
    uint8_t head[TD_CONTROL_HEADER_BYTES], buf[4096];
    if (read(c, head, sizeof head) == (ssize_t)sizeof head) { /* the request: length, body */
      size_t want = (size_t)head[0] << 24 | (size_t)head[1] << 16 | (size_t)head[2] << 8 | head[3];
      ssize_t got = 0;
      while (want > 0 && (got = read(c, buf, want < sizeof buf ? want : sizeof buf)) > 0)
        want -= (size_t)got;
      if (send(c, frame, len, MSG_NOSIGNAL) < 0)
        fprintf(stderr, "td_control_peer: send: %s\n", strerror(errno));
    }
    close(c);
  }
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "answer") == 0)
    return answer(argv[2], argv[3]);
  if (argc == 5 && strcmp(argv[1], "rude") == 0)
    return rude(argv[2], atoi(argv[3]), argv[4]);
  if (argc == 3 && strcmp(argv[1], "mute") == 0)
    return mute(argv[2]);
  fprintf(stderr,
          "usage: td_control_peer rude PATH N status|rounds | mute PATH | answer PATH JSON\n");
  return 2;
}
