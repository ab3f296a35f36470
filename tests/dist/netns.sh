#!/usr/bin/env bash
# The emulated nodes (examples/scaling/netns.sh): up twice and down twice leave nothing
# behind (no namespace of its own, no link or qdisc: they live in those namespaces); while up,
# the nodes reach each other and an MPI job spans them, one host name per node; then the
# link-cut drill (examples/scaling/link_cut.sh): the hang verdict, a supervised resume, bitwise.
# Skips (77) where this machine cannot make network namespaces.
#   netns.sh SOURCE_DIR
set -euo pipefail
src=$1
ns=$src/examples/scaling/netns.sh
ip netns add loomprobe 2> /dev/null || { echo "skip: cannot create network namespaces here"; exit 77; }
ip netns del loomprobe
mine() { ip netns list | awk '{print $1}' | grep -cE '^loom(node[0-9]+|hub)$' || true; }
trap '"$ns" down' EXIT
for i in 1 2; do "$ns" up 2 1gbit > /dev/null; done
[ "$(mine)" -eq 3 ] || { echo "FAIL: expected 2 nodes and a hub, found $(mine)"; exit 1; }
"$ns" status
hosts=$("$ns" mpirun -np 4 hostname | sort | uniq -c | awk '{print $2 "x" $1}' | tr '\n' ' ')
[ "$hosts" = "loomnode0x2 loomnode1x2 " ] || { echo "FAIL: ranks ran on '$hosts'"; exit 1; }
for i in 1 2; do "$ns" down; done
[ "$(mine)" -eq 0 ] || { echo "FAIL: $(mine) namespaces left behind"; exit 1; }
"$src/examples/scaling/link_cut.sh"
[ "$(mine)" -eq 0 ] || { echo "FAIL: the drill left namespaces behind"; exit 1; }
echo ok
