"""The emulated cluster: network namespaces as hosts, ``tc`` as NICs, ``torchrun`` on each."""

from .netns import Cluster, ClusterError, check_privileges, sweep_stale
from .run import HostResult, run_hosts

__all__ = ["Cluster", "ClusterError", "HostResult", "check_privileges", "run_hosts", "sweep_stale"]
