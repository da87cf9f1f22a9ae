/* advertise.h: the tcp:// endpoint a node tells its peers to reach it at.
 *
 * A node bound to a wildcard address (tcp://0.0.0.0:PORT, or the host '*')
 * listens on every interface, but 0.0.0.0 is no address a peer can dial.
 * Unless the operator names one (--advertise), the node advertises to each
 * peer the address of its own interface that routes to that peer: the kernel
 * answers that (a UDP socket connect()ed to the peer, then getsockname(); no
 * packet is sent). Before it knows any peer it shows its first non-loopback
 * IPv4 interface. A loopback address is never handed to a peer that is not
 * on loopback itself: the caller refuses instead and says to set --advertise.
 * Functions over strings and the kernel's routing table; no state, any thread.
 * IPv4 only, like the wildcard traind binds (ZMQ_IPV6 is not set). */
#ifndef TD_ADVERTISE_H
#define TD_ADVERTISE_H

#include <stdbool.h>
#include <stddef.h>

/* 0 when `endpoint` can be advertised: tcp://HOST:PORT with a host that is not
 * a wildcard and a port in 1..65535. TD_ECONFIG + a one-line why otherwise. */
int td_advertise_check(const char *endpoint, char *why, size_t why_len);

/* Split tcp://HOST:PORT into host (without the brackets of [v6]) and port;
 * false when it is not of that form or a part does not fit its buffer. */
bool td_advertise_split(const char *endpoint, char *host, size_t host_cap, char *port,
                        size_t port_cap);

/* The host is a wildcard (0.0.0.0, *, [::]): "listen on every interface". */
bool td_advertise_is_wildcard(const char *endpoint);
/* The host is a loopback address (127.0.0.0/8, localhost, [::1]). */
bool td_advertise_is_loopback(const char *endpoint);

/* tcp://ADDR:port into out, ADDR being this machine's IPv4 address on the
 * interface that routes to the host of peer_endpoint. TD_EINVAL for a
 * malformed endpoint, TD_EIO when the host is not a numeric IPv4 address (no
 * DNS: this runs on the loop thread) or has no route. */
int td_advertise_route(const char *peer_endpoint, const char *port, char *out, size_t cap);

/* tcp://ADDR:port into out with the address of the first interface that is
 * up, IPv4 and not loopback; TD_ENOENT when there is none. */
int td_advertise_first_interface(const char *port, char *out, size_t cap);

#endif
