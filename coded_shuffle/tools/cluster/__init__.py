"""The emulated cluster: network namespaces as hosts, ``tc`` as NICs, ``torchrun`` on each."""

from coded_shuffle.tools.cluster.netns import Cluster, ClusterError, check_privileges, sweep_stale
from coded_shuffle.tools.cluster.run import HostResult, run_hosts

__all__ = ["Cluster", "ClusterError", "HostResult", "check_privileges", "run_hosts", "sweep_stale"]
