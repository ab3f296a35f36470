#!/usr/bin/env bash
# The emulated nodes (examples/scaling/netns.sh): up twice and down twice leave nothing
# behind (no namespace of its own, no link or qdisc: they live in those namespaces); while up,
# the nodes reach each other and an MPI job spans them, one host name per node; then the
# link-cut drill (examples/scaling/link_cut.sh): the hang verdict, a supervised resume, bitwise;
# and the lost-node drill (examples/scaling/elastic.sh): a node cut for good, the job relaunched
# at dp 2 on the node left, with the bits of a run that lost nothing; and the invariant mode's
# cost script (examples/scaling/invariant_cost.sh) at 2 steps: its table's row, no node left.
# Skips (77) where this machine cannot make network namespaces.
#   netns.sh SOURCE_DIR LOOM COMPARE
set -euo pipefail
src=$1
export LOOM=$2 COMPARE=$3 LOOM_NETNS_STATE=${TMPDIR:-/tmp}/loom-netns-test
ns=$src/examples/scaling/netns.sh
ip netns add loomprobe 2> /dev/null || { echo "skip: cannot create network namespaces here"; exit 77; }
probe=0
ip -n loomprobe link add probe0 type veth peer name probe1 2> /dev/null &&
  ip -n loomprobe link add probebr type bridge 2> /dev/null &&
  ip netns exec loomprobe tc qdisc replace dev probe0 root tbf rate 1gbit burst 256kb latency 50ms 2> /dev/null || probe=1
ip netns del loomprobe
[ $probe -eq 0 ] || { echo "skip: no veth, bridge or tc shaping in this kernel"; exit 77; }
mine() { ip netns list | awk '{print $1}' | grep -cE '^loom(node[0-9]+|hub)$' || true; }
trap '"$ns" down' EXIT
for i in 1 2; do "$ns" up 2 1gbit > /dev/null; done
[ "$(mine)" -eq 3 ] || { echo "FAIL: expected 2 nodes and a hub, found $(mine)"; exit 1; }
"$ns" status
# Ranks in order over the nodes (tp, innermost, inside one), arguments passed as they are.
placed=$("$ns" mpirun -np 4 sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname) $0"' "two words" | sort | tr '\n' ';')
[ "$placed" = "0 loomnode0 two words;1 loomnode0 two words;2 loomnode1 two words;3 loomnode1 two words;" ] ||
  { echo "FAIL: ranks ran as '$placed'"; exit 1; }
ip netns exec loomnode1 tc qdisc show dev eth0 | grep -q "rate 1Gbit" || { echo "FAIL: node 1's link is not shaped"; exit 1; }
for i in 1 2; do "$ns" down; done
[ "$(mine)" -eq 0 ] || { echo "FAIL: $(mine) namespaces left behind"; exit 1; }
"$src/examples/scaling/link_cut.sh"
[ "$(mine)" -eq 0 ] || { echo "FAIL: the drill left namespaces behind"; exit 1; }
"$src/examples/scaling/elastic.sh"
[ "$(mine)" -eq 0 ] || { echo "FAIL: the elastic drill left namespaces behind"; exit 1; }
cost=$("$src/examples/scaling/invariant_cost.sh" --steps 2 --warmup 1 --pairs 1 --links 1gbit --models llama \
  --layouts dp4:0) || { echo "FAIL: invariant_cost.sh: $cost"; exit 1; }
echo "$cost"
echo "$cost" | grep -qE '^\| llama \| dp 4 \(2 a node\), DDP \| 1gbit \| [0-9.]+ \| [0-9.]+ \| .*\| AR 3\.94 / .*send 5\.91 \| [0-9.]+ / [0-9.]+ \|' ||
  { echo "FAIL: invariant_cost.sh printed no row for dp 4 DDP"; exit 1; }
[ "$(mine)" -eq 0 ] || { echo "FAIL: invariant_cost.sh left namespaces behind"; exit 1; }
echo ok
