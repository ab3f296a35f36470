#!/usr/bin/env bash
# Open MPI's launch agent for examples/scaling/netns.sh: "netns_exec.sh HOST COMMAND..." runs the
# command (an Open MPI daemon) in the namespace of the emulated node whose address is HOST,
# under that node's own host name.
set -euo pipefail
host=$1
shift
i=$(( ${host##*.} - 1 ))
exec ip netns exec "loomnode$i" unshare --uts sh -c "hostname loomnode$i && exec $*"
