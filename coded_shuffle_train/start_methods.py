"""How the local launcher starts the ranks (``dist.start_method``), without torch: the launcher
reads it before it starts the fork server, whose imports of torch and the jobs then run beside
the launcher's own. Never ``fork``: the launcher runs threads, and a child forked from it can
inherit a held lock."""

START_METHODS = ("forkserver", "spawn")
DEFAULT_START_METHOD = START_METHODS[0]  # DistConf.start_method's default
