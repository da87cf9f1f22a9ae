#!/bin/bash
# cluster_full.sh: the cluster limit (TD_MAX_NODES, 256 members) refuses the
# next node with one line (issue 39). Node a is tests/integration/
# traind_crowded, the product's traind whose membership table starts with 254
# placeholder members (a and 254 others: room for one), so the 257th join is
# met by the real table and the real refusal without 257 processes. b joins
# by invite and fills the table; c's join by invite and d's join by key
# (its key admitted beforehand) are refused: each `trainctl join` exits
# non-zero with one line that says the cluster is full, a counts both
# (drops.cluster_full) and logs them, the refused invite stays unused, and
# b stays a member. Then node e, crowded to the brim (no room) with
# placeholders dead for an hour, takes f in: f's invite join succeeds, e
# logs and counts the placeholder whose slot f took (members_evicted).
. "${top_srcdir:-.}/tests/integration/cluster_lib.sh"
CROWDED="${top_builddir:-$(pwd)}/tests/integration/traind_crowded"
grep -q TD_CROWDED_ROOM "$CROWDED" || { fail "traind_crowded has no placeholder hook"; finish; }

# start_bare NAME: a node that lists no key (to join by invite).
start_bare() {
  local name=$1 i
  mkdir -p "$T/$name"
  "$TRAIND" --data-dir "$T/$name" --listen tcp://127.0.0.1:0 --control "$T/$name/ctl" \
    --heartbeat-ms 200 --threads 1 --log-level info >>"$T/$name.log" 2>&1 &
  echo $! >"$T/$name.pid"
  NODES+=("$name")
  for i in $(seq 100); do
    [ -S "$T/$name/ctl" ] && [ -s "$T/$name/endpoint" ] && return 0
    sleep 0.1
  done
  fail "$name did not start"
}
drops_of() { ctl "$1" status --json | grep -o "\"$2\":[0-9]*" | head -n1 | cut -d: -f2; }

TD_CROWDED_ROOM=1 TRAIND="$CROWDED" start_node a || finish
start_node d || finish # a and d admit each other's keys: d joins by key
start_bare b
start_bare c
[ "$failures" -eq 0 ] || finish
A=$(endpoint_of a)

ctl a invite --count 2 >"$T/invites" || fail "invite --count 2 on a"
ctl b join "$(sed -n 1p "$T/invites")" >/dev/null || fail "b (the 256th member) joins by invite"
wait_peers b 1 30 && pass "b, the 256th member, sees a alive" || fail "b does not see a"

# ---- the 257th node, by invite and by key -----------------------------------------------
run by_invite "$TRAINCTL" --socket "$T/c/ctl" join "$(sed -n 2p "$T/invites")"
expect_error by_invite "^trainctl: (error: )?join refused by $A: cluster is full: 256 members, the most traind supports$"
run by_key ctl d join "$A"
expect_error by_key "^trainctl: (error: )?join refused by $A: cluster is full: 256 members, the most traind supports$"

full=$(drops_of a cluster_full)
[ "${full:-0}" -ge 2 ] && pass "a counted $full refused joins (drops.cluster_full)" \
  || fail "a counted ${full:-no} refused joins, expected 2"
grep -q "asked to join (by invite): cluster is full" "$T/a.log" && pass "a logged the refused invite" \
  || fail "no log line on a for the refused invite"
grep -q "asked to join (hello): cluster is full" "$T/a.log" && pass "a logged the refused hello" \
  || fail "no log line on a for the refused hello"
grep -qF "admitted key $(key_of c)" "$T/a.log" && fail "the refused invite admitted c" \
  || pass "the refused invite admitted nothing"
ctl c peers --json | grep -q '"state":"alive"' && fail "c counts a member after its refusal" \
  || pass "c, refused, has no member"
sleep 1
wait_peers b 1 10 && pass "b is still a member after the refusals" || fail "b lost a"

# ---- a full table whose dead members are long dead gives a slot -----------------------
TD_CROWDED_ROOM=0 TD_CROWDED_SILENT_S=3600 TRAIND="$CROWDED" start_node e || finish
start_bare f
ctl e invite >"$T/invite_e" || fail "invite on e"
ctl f join "$(cat "$T/invite_e")" >/dev/null && pass "f joins e, full of long-dead members" \
  || fail "f's join of the full e failed: $(tail -n 3 "$T/f.log")"
wait_peers f 1 30 && pass "f sees e alive" || fail "f does not see e"
grep -q "membership table full: peer fa11.* gives its slot to a new node" "$T/e.log" \
  && pass "e logged the eviction" || fail "no eviction line in e's log"
evicted=$(drops_of e members_evicted)
[ "${evicted:-0}" -ge 1 ] && pass "e counted $evicted eviction(s) (members_evicted)" \
  || fail "e counted ${evicted:-no} evictions"
finish
