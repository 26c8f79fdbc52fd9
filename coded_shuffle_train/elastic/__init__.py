"""What the elastic jobs (``job=elastic_gd``, ``job=elastic_matmul``) share: the channel
between master and workers (:mod:`.channel`), the worker's loop (:mod:`.worker`), their
settings, console and master frame (:mod:`.common`), and the master-free mode (:mod:`.peers`).
"""
