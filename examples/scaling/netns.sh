#!/usr/bin/env bash
# Emulated nodes on one machine: network namespaces loomnode0..N-1, each with one interface
# eth0 (10.77.0.(i+1)/24) joined by veth pairs to a bridge inside a hub namespace (loomhub), and
# tc shaping every node's link: netem (rate and delay) where the kernel has it, else tbf (rate
# only; the delay is refused, not ignored). Within a node, ranks share memory;
# between nodes, MPI runs over TCP through the shaped links. Only the namespaces it made are
# ever touched (their names are its own), and everything goes away with them: `down` leaves no
# namespace, link or qdisc, and both `up` and `down` are safe to run twice.
#   netns.sh up NODES [RATE [DELAY]]     e.g. up 2 1gbit 100us (default: 10gbit, no delay)
#   netns.sh shape RATE DELAY            reshape every node's link
#   netns.sh cut NODE | heal NODE        take a node's link down (nothing passes) | bring it back
#   netns.sh mpirun -np N PROGRAM ARGS   mpirun over the nodes, N / NODES ranks on each, in rank
#                                        order (so tp, innermost, stays inside a node)
#   netns.sh down | status
set -euo pipefail
hub=loomhub
prefix=loomnode
net=10.77.0
here=$(cd "$(dirname "$0")" && pwd)
state=/run/loom-netns  # the shaping, so that `heal` restores it

nodes() { ip netns list | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" | sort -V || true; }
qdisc() {  # NODE RATE DELAY
  local ns=$prefix$1 rate=$2 delay=$3
  if ip netns exec "$ns" tc qdisc replace dev eth0 root netem rate "$rate" delay "$delay" 2>/dev/null; then return; fi
  if [ "$delay" != 0 ]; then
    echo "netns: this kernel has no netem qdisc, so links cannot be delayed; use DELAY 0 (rate only, tbf)" >&2
    exit 1
  fi
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
}

case "${1:-}" in
  up)
    n=${2:?netns.sh up NODES [RATE [DELAY]]} rate=${3:-10gbit} delay=${4:-0}
    "$0" down
    ip netns add $hub
    ip -n $hub link add br0 type bridge
    ip -n $hub link set br0 up
    for ((i = 0; i < n; ++i)); do
      ns=$prefix$i
      ip netns add "$ns"
      ip link add eth0 netns "$ns" type veth peer name "v$i" netns $hub
      ip -n $hub link set "v$i" master br0 up
      ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      qdisc "$i" "$rate" "$delay"
    done
    mkdir -p "$(dirname $state)"
    echo "$rate $delay" > $state
    echo "netns: $n nodes ($net.1-$n), links $rate, delay $delay"
    ;;
  shape)
    rate=${2:?netns.sh shape RATE DELAY} delay=${3:?netns.sh shape RATE DELAY}
    for ns in $(nodes); do qdisc "${ns#$prefix}" "$rate" "$delay"; done
    echo "$rate $delay" > $state
    ;;
  cut)
    ip -n "$prefix${2:?netns.sh cut NODE}" link set eth0 down
    ;;
  heal)
    ip -n "$prefix${2:?netns.sh heal NODE}" link set eth0 up
    read -r rate delay < $state
    qdisc "$2" "$rate" "$delay"
    ;;
  mpirun)
    [ "${2:-}" = -np ] || { echo "netns: netns.sh mpirun -np N PROGRAM ARGS" >&2; exit 2; }
    count=${3:?netns.sh mpirun -np N PROGRAM ARGS}
    shift 3
    k=$(nodes | wc -l)
    [ "$k" -gt 0 ] || { echo "netns: no nodes; run netns.sh up first" >&2; exit 1; }
    (( count % k == 0 )) || { echo "netns: $count ranks do not spread evenly over $k nodes" >&2; exit 2; }
    per=$(( count / k )) hosts=""
    for ns in $(nodes); do hosts+="${hosts:+,}$net.$(( ${ns#$prefix} + 1 )):$per"; done
    # mpirun runs on node 0 under its own host name; the other nodes' daemons start through
    # netns_exec.sh (each in its namespace, with its own host name, so that Open MPI uses
    # shared memory only within a node and TCP, on eth0, between them).
    exec ip netns exec ${prefix}0 unshare --uts sh -c "hostname ${prefix}0 && exec mpirun --allow-run-as-root \
      --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 --host $hosts -np $count \
      --mca plm_rsh_agent $here/netns_exec.sh --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 \
      --mca oob_tcp_if_include eth0 $(printf '%q ' "$@")"
    ;;
  down)
    for ns in $(nodes); do ip netns del "$ns"; done
    ip netns list | awk '{print $1}' | grep -qx $hub && ip netns del $hub
    rm -f $state
    ;;
  status)
    for ns in $(nodes); do echo "$ns: $(ip -n "$ns" -brief addr show eth0 | awk '{print $3}') $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"; done
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
