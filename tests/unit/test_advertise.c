/* test_advertise.c: what a node may tell its peers to dial. --advertise
 * takes a tcp:// endpoint with a host and a port 1..65535, never a wildcard;
 * wildcard and loopback hosts are told apart; the kernel names the address
 * that routes to a peer (loopback for a peer on loopback), and the first
 * non-loopback interface is never a loopback address. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "daemon/net/advertise.h"

START_TEST(advertise_takes_a_tcp_endpoint_with_host_and_port) {
  char why[256];
  ck_assert_int_eq(td_advertise_check("tcp://10.0.0.7:7070", why, sizeof why), 0);
  ck_assert_int_eq(td_advertise_check("tcp://node1.example.org:7070", why, sizeof why), 0);
  ck_assert_int_eq(td_advertise_check("tcp://[2001:db8::1]:7070", why, sizeof why), 0);
  static const char *const bad[] = {
      "10.0.0.7:7070", "udp://10.0.0.7:7070", "tcp://10.0.0.7", "tcp://:7070",
      "tcp://10.0.0.7:", "tcp://10.0.0.7:0", "tcp://10.0.0.7:65536", "tcp://10.0.0.7:70x",
      "tcp://10.0.0.7:-1", "tcp://0.0.0.0:7070", "tcp://*:7070", "tcp://[::]:7070",
      "tcp://a b:7070", "tcp://[]:7070", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    why[0] = '\0';
    ck_assert_msg(td_advertise_check(bad[i], why, sizeof why) == TD_ECONFIG, "%s", bad[i]);
    ck_assert_msg(strncmp(why, "advertise: ", 11) == 0 && strchr(why, '\n') == NULL, "%s", why);
  }
}
END_TEST

START_TEST(wildcards_and_loopbacks_are_told_apart) {
  ck_assert(td_advertise_is_wildcard("tcp://0.0.0.0:7070"));
  ck_assert(td_advertise_is_wildcard("tcp://*:7070"));
  ck_assert(td_advertise_is_wildcard("tcp://[::]:7070"));
  ck_assert(!td_advertise_is_wildcard("tcp://10.0.0.1:7070"));
  ck_assert(td_advertise_is_loopback("tcp://127.0.0.1:7070"));
  ck_assert(td_advertise_is_loopback("tcp://127.8.9.10:1"));
  ck_assert(td_advertise_is_loopback("tcp://localhost:7070"));
  ck_assert(td_advertise_is_loopback("tcp://[::1]:7070"));
  ck_assert(!td_advertise_is_loopback("tcp://10.0.0.1:7070"));
  ck_assert(!td_advertise_is_loopback("tcp://128.0.0.1:7070"));
  ck_assert(!td_advertise_is_loopback("tcp://127.example.org:7070"));
  ck_assert(!td_advertise_is_loopback("tcp://0.0.0.0:7070"));
  char host[64], port[8];
  ck_assert(td_advertise_split("tcp://[::1]:7070", host, sizeof host, port, sizeof port));
  ck_assert_str_eq(host, "::1");
  ck_assert_str_eq(port, "7070");
  ck_assert(!td_advertise_split("tcp://10.0.0.1:123456789", host, sizeof host, port, sizeof port));
}
END_TEST

START_TEST(the_kernel_names_the_address_that_routes_to_a_peer) {
  char out[128];
  /* a peer on loopback is reached from loopback, with our own port */
  ck_assert_int_eq(td_advertise_route("tcp://127.0.0.1:9", "7070", out, sizeof out), 0);
  ck_assert_str_eq(out, "tcp://127.0.0.1:7070");
  ck_assert_int_eq(td_advertise_route("not an endpoint", "7070", out, sizeof out), TD_EINVAL);
  /* names are not resolved (no DNS on the loop thread): the caller's default */
  ck_assert_int_eq(td_advertise_route("tcp://localhost:9", "7070", out, sizeof out), TD_EIO);
  /* the first interface, when there is one, is not loopback */
  int rc = td_advertise_first_interface("7070", out, sizeof out);
  ck_assert(rc == 0 || rc == TD_ENOENT);
  if (rc == 0) {
    ck_assert(!td_advertise_is_loopback(out));
    ck_assert(!td_advertise_is_wildcard(out));
    ck_assert_int_eq(td_advertise_check(out, NULL, 0), 0);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("advertise");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, advertise_takes_a_tcp_endpoint_with_host_and_port);
  tcase_add_test(tc, wildcards_and_loopbacks_are_told_apart);
  tcase_add_test(tc, the_kernel_names_the_address_that_routes_to_a_peer);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
