#!/usr/bin/env bash
# Emulated nodes on one machine: network namespaces loomnode0..N-1, each with one interface
# eth0 (10.77.0.(i+1)/24) joined by veth pairs to a bridge inside a hub namespace (loomhub), and
# tc shaping every node's link: netem (rate and delay) where the kernel has it, else tbf (rate
# only; a delay is refused, not ignored). Within a node, ranks share memory; between nodes, MPI
# runs over TCP through the shaped links. The namespaces it makes are listed in its state
# directory, and `down` deletes those and nothing else (their links and qdiscs go with them);
# `up` refuses to adopt namespaces of these names it did not make. Both are safe twice.
#   netns.sh up NODES [RATE [DELAY]]     e.g. up 2 1gbit (default: 10gbit, no delay)
#   netns.sh shape RATE DELAY            reshape every node's link
#   netns.sh cut NODE | heal NODE        take a node's link down (nothing passes) | bring it back
#   netns.sh mpirun [--host IP:SLOTS,...] -np N PROGRAM ARGS
#                                        mpirun over the nodes, N / NODES ranks on each (or the
#                                        hosts given), in rank order (so tp, innermost, stays
#                                        inside a node)
#   netns.sh down | status
set -euo pipefail
hub=loomhub
prefix=loomnode
net=10.77.0
here=$(cd "$(dirname "$0")" && pwd)
state=${LOOM_NETNS_STATE:-/run/loom-netns}  # made: the namespaces; shape: the links' rate and delay

made() { [ -f "$state/made" ] && cat "$state/made" || true; }
nodes() { made | grep -E "^${prefix}[0-9]+$" | sort -V || true; }
exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }
qdisc() {  # NODE RATE DELAY
  local ns=$prefix$1 rate=$2 delay=$3
  if ip netns exec "$ns" tc qdisc replace dev eth0 root netem rate "$rate" delay "$delay" 2> /dev/null; then return; fi
  if [ "$delay" != 0 ]; then
    echo "netns: this kernel has no netem qdisc, so links cannot be delayed; use DELAY 0 (rate only, tbf)" >&2
    return 1
  fi
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
}
make_ns() {
  exists "$1" && { echo "netns: namespace $1 exists but this script did not make it; remove it by hand" >&2; return 1; }
  ip netns add "$1"
  echo "$1" >> "$state/made"
}

case "${1:-}" in
  up)
    n=${2:?netns.sh up NODES [RATE [DELAY]]} rate=${3:-10gbit} delay=${4:-0}
    [[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "netns: NODES must be 1-99, not '$n'" >&2; exit 2; }
    "$0" down
    mkdir -p "$state"
    trap '"$0" down' ERR  # a half-made set of nodes is taken down again
    make_ns $hub
    ip -n $hub link add br0 type bridge
    ip -n $hub link set br0 up
    for ((i = 0; i < n; ++i)); do
      ns=$prefix$i
      make_ns "$ns"
      ip link add eth0 netns "$ns" type veth peer name "v$i" netns $hub
      ip -n $hub link set "v$i" master br0 up
      ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      qdisc "$i" "$rate" "$delay"
    done
    echo "$rate $delay" > "$state/shape"
    trap - ERR
    echo "netns: $n nodes ($net.1-$n), links $rate, delay $delay"
    ;;
  shape)
    rate=${2:?netns.sh shape RATE DELAY} delay=${3:?netns.sh shape RATE DELAY}
    for ns in $(nodes); do qdisc "${ns#"$prefix"}" "$rate" "$delay"; done
    echo "$rate $delay" > "$state/shape"
    ;;
  cut)
    node=${2:?netns.sh cut NODE}
    nodes | grep -qx "$prefix$node" || { echo "netns: no node $node" >&2; exit 2; }
    ip -n "$prefix$node" link set eth0 down
    ;;
  heal)
    node=${2:?netns.sh heal NODE}
    nodes | grep -qx "$prefix$node" || { echo "netns: no node $node" >&2; exit 2; }
    ip -n "$prefix$node" link set eth0 up
    read -r rate delay < "$state/shape"
    qdisc "$node" "$rate" "$delay"
    ;;
  mpirun)
    shift
    hosts=""
    if [ "${1:-}" = --host ]; then hosts=${2:?netns.sh mpirun --host IP:SLOTS,... -np N PROGRAM ARGS}; shift 2; fi
    [ "${1:-}" = -np ] && [[ "${2:-}" =~ ^[0-9]+$ ]] ||
      { echo "netns: netns.sh mpirun [--host IP:SLOTS,...] -np N PROGRAM ARGS" >&2; exit 2; }
    count=$2
    shift 2
    k=$(nodes | wc -l)
    [ "$k" -gt 0 ] || { echo "netns: no nodes; run netns.sh up first" >&2; exit 1; }
    if [ -z "$hosts" ]; then
      ((count % k == 0)) || { echo "netns: $count ranks do not spread evenly over $k nodes" >&2; exit 2; }
      per=$((count / k))
      for ns in $(nodes); do hosts+="${hosts:+,}$net.$((${ns#"$prefix"} + 1)):$per"; done
    fi
    # mpirun runs on node 0 under its own host name; the other nodes' daemons start through
    # netns_exec.sh (each in its namespace, under its own host name, so that Open MPI uses
    # shared memory only within a node and TCP, on eth0, between them). The program and its
    # arguments pass through as they are.
    exec ip netns exec ${prefix}0 unshare --uts sh -c 'hostname "$0" && exec "$@"' ${prefix}0 \
      mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 --host "$hosts" -np "$count" \
      --mca plm_rsh_agent "$here/netns_exec.sh" --mca btl self,vader,tcp --mca btl_tcp_if_include eth0 \
      --mca oob_tcp_if_include eth0 "$@"
    ;;
  down)
    for ns in $(made); do exists "$ns" && ip netns del "$ns"; done
    rm -f "$state/made" "$state/shape"
    ;;
  status)
    for ns in $(nodes); do
      echo "$ns: $(ip -n "$ns" -brief addr show eth0 | awk '{print $2, $3}') $(ip netns exec "$ns" tc qdisc show dev eth0 | head -1)"
    done
    ;;
  *)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
