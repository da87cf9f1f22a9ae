/* advertise.c: which of this machine's addresses a peer can reach it at
 * (daemon/advertise.h): endpoint parsing, the wildcard and loopback tests,
 * and the two questions asked of the kernel (the route to a peer, the
 * interfaces). Used by transport.c for every link and by settings.c to check
 * --advertise. */
#include "daemon/net/advertise.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"

bool td_advertise_split(const char *endpoint, char *host, size_t host_cap, char *port,
                        size_t port_cap) {
  if (endpoint == NULL || strncmp(endpoint, "tcp://", 6) != 0)
    return false;
  const char *h = endpoint + 6;
  const char *colon = strrchr(h, ':');
  if (colon == NULL || colon == h)
    return false;
  size_t hlen = (size_t)(colon - h);
  if (h[0] == '[') { /* [v6]:port */
    if (hlen < 3 || h[hlen - 1] != ']')
      return false;
    h++;
    hlen -= 2;
  }
  size_t plen = strlen(colon + 1);
  if (hlen == 0 || hlen >= host_cap || plen == 0 || plen >= port_cap)
    return false;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  memcpy(port, colon + 1, plen + 1);
  return true;
}

bool td_advertise_is_wildcard(const char *endpoint) {
  char host[256], port[16];
  if (!td_advertise_split(endpoint, host, sizeof host, port, sizeof port))
    return false;
  return strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || strcmp(host, "::") == 0;
}

bool td_advertise_is_loopback(const char *endpoint) {
  char host[256], port[16];
  if (!td_advertise_split(endpoint, host, sizeof host, port, sizeof port))
    return false;
  if (strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0)
    return true;
  struct in_addr a;
  return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

int td_advertise_check(const char *endpoint, char *why, size_t why_len) {
  char host[256], port[16];
  if (!td_advertise_split(endpoint, host, sizeof host, port, sizeof port))
    return td_why(why, why_len, TD_ECONFIG,
                  "advertise: expected tcp://HOST:PORT (where peers reach this node), got '%s'",
                  endpoint);
  if (td_advertise_is_wildcard(endpoint))
    return td_why(why, why_len, TD_ECONFIG,
                  "advertise: '%s' is a wildcard, which no peer can dial: name this machine's "
                  "address or host name",
                  endpoint);
  char *end;
  unsigned long p = strtoul(port, &end, 10);
  if (port[0] < '0' || port[0] > '9' || *end != '\0' || p < 1 || p > 65535)
    return td_why(why, why_len, TD_ECONFIG,
                  "advertise: the port of '%s' must be a number in 1..65535 (the port peers "
                  "dial)",
                  endpoint);
  for (const char *c = host; *c; c++)
    if (*c <= ' ' || *c == '/' || *c == '@' || *c == '?' || *c == '#')
      return td_why(why, why_len, TD_ECONFIG, "advertise: '%s' has a bad host name", endpoint);
  return 0;
}

static void format_endpoint(const struct in_addr *a, const char *port, char *out, size_t cap) {
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, a, text, sizeof text);
  snprintf(out, cap, "tcp://%s:%s", text, port);
}

int td_advertise_route(const char *peer_endpoint, const char *port, char *out, size_t cap) {
  char host[256], peer_port[16];
  if (!td_advertise_split(peer_endpoint, host, sizeof host, peer_port, sizeof peer_port))
    return TD_EINVAL;
  /* numeric hosts only: a name would block the loop thread on DNS, and any
   * member may hand us one (hello, gossip); such a peer gets the default */
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM,
                           .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  if (getaddrinfo(host, peer_port, &hints, &res) != 0 || res == NULL)
    return TD_EIO;
  int rc = TD_EIO;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  /* connect() on a UDP socket only picks the route and the source address */
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    struct sockaddr_in local;
    socklen_t len = sizeof local;
    if (getsockname(fd, (struct sockaddr *)&local, &len) == 0 && local.sin_family == AF_INET &&
        local.sin_addr.s_addr != htonl(INADDR_ANY)) {
      format_endpoint(&local.sin_addr, port, out, cap);
      rc = 0;
    }
  }
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
  return rc;
}

int td_advertise_first_interface(const char *port, char *out, size_t cap) {
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all) != 0)
    return TD_ENOENT;
  int rc = TD_ENOENT;
  for (struct ifaddrs *i = all; i != NULL && rc != 0; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK))
      continue;
    format_endpoint(&((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr, port, out,
                    cap);
    rc = 0;
  }
  freeifaddrs(all);
  return rc;
}
