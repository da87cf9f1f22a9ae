/* td_sniff.c: capture TCP on the loopback interface, for td_intruder.sh,
 * without tshark: a raw AF_PACKET socket (needs root or CAP_NET_RAW) on `lo`
 * reads every frame for SECONDS, keeps the IPv4 TCP segments to or from one
 * of the given ports, and looks for MARKER in their payloads (and across the
 * boundary of consecutive segments of one direction, in case TCP split it).
 * Usage: td_sniff [--until-hit] SECONDS MARKER PORT...
 * With --until-hit it stops at the first sighting of MARKER (SECONDS is then
 * only the longest it waits: a control capture must not depend on how soon a
 * loaded machine gets the traffic going). Prints
 * `packets N payload_bytes B marker_hits K`; exits 77 when it cannot open the
 * capture (no privilege), 2 on bad arguments. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 16
#define TAIL_KEEP 64

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int find(const uint8_t *hay, size_t n, const char *needle, size_t m) {
  int hits = 0;
  for (size_t i = 0; m > 0 && i + m <= n; i++)
    if (memcmp(hay + i, needle, m) == 0)
      hits++;
  return hits;
}

int main(int argc, char **argv) {
  bool until_hit = argc > 1 && strcmp(argv[1], "--until-hit") == 0;
  if (until_hit) {
    argv++;
    argc--;
  }
  if (argc < 4) {
    fprintf(stderr, "usage: td_sniff [--until-hit] SECONDS MARKER PORT...\n");
    return 2;
  }
  double seconds = atof(argv[1]);
  const char *marker = argv[2];
  size_t mlen = strlen(marker);
  uint16_t ports[MAX_PORTS];
  int n_ports = 0;
  for (int i = 3; i < argc && n_ports < MAX_PORTS; i++)
    ports[n_ports++] = (uint16_t)atoi(argv[i]);
  int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) {
    fprintf(stderr, "td_sniff: cannot open a raw socket: %s\n", strerror(errno));
    return 77;
  }
  struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL),
                            .sll_ifindex = (int)if_nametoindex("lo")};
  if (sll.sll_ifindex == 0 || bind(fd, (struct sockaddr *)&sll, sizeof sll) != 0) {
    fprintf(stderr, "td_sniff: cannot bind to lo: %s\n", strerror(errno));
    return 77;
  }
  struct timeval tv = {0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  printf("listening\n");
  fflush(stdout);
  static uint8_t frame[1 << 16];
  uint8_t joined[TAIL_KEEP + sizeof frame];
  size_t tail_len = 0;
  long packets = 0, hits = 0;
  unsigned long long bytes = 0;
  double until = now_s() + seconds;
  while (now_s() < until && !(until_hit && hits > 0)) {
    struct sockaddr_ll from;
    socklen_t fl = sizeof from;
    ssize_t got = recvfrom(fd, frame, sizeof frame, 0, (struct sockaddr *)&from, &fl);
    if (got < 0)
      continue;
    if (from.sll_pkttype == PACKET_OUTGOING)
      continue; /* on lo every frame is seen twice: keep the incoming copy */
    size_t off = 14; /* Ethernet header (lo has a zeroed one) */
    if ((size_t)got < off + 20 || frame[12] != 0x08 || frame[13] != 0x00)
      continue;
    const uint8_t *ip = frame + off;
    size_t ihl = (size_t)(ip[0] & 0x0f) * 4;
    if ((ip[0] >> 4) != 4 || ip[9] != 6 || (size_t)got < off + ihl + 20)
      continue;
    const uint8_t *tcp = ip + ihl;
    uint16_t sport = (uint16_t)(tcp[0] << 8 | tcp[1]), dport = (uint16_t)(tcp[2] << 8 | tcp[3]);
    bool ours = false;
    for (int i = 0; i < n_ports; i++)
      ours = ours || sport == ports[i] || dport == ports[i];
    if (!ours)
      continue;
    size_t thl = (size_t)(tcp[12] >> 4) * 4;
    size_t ip_total = (size_t)(ip[2] << 8 | ip[3]);
    if (ip_total < ihl + thl || off + ip_total > (size_t)got)
      continue;
    const uint8_t *payload = tcp + thl;
    size_t plen = ip_total - ihl - thl;
    packets++;
    bytes += plen;
    if (plen == 0)
      continue;
    /* the marker may straddle two segments: search the last bytes of the
     * previous payload joined to this one */
    memcpy(joined + tail_len, payload, plen);
    hits += find(joined, tail_len + plen, marker, mlen) -
            find(joined, tail_len, marker, mlen);
    size_t keep = plen < TAIL_KEEP ? plen : TAIL_KEEP;
    memmove(joined, payload + plen - keep, keep);
    tail_len = keep;
  }
  close(fd);
  printf("packets %ld payload_bytes %llu marker_hits %ld\n", packets, bytes, hits);
  return 0;
}
