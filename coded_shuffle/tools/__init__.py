"""The tools: the ``coded-shuffle`` command (``evaluate``, ``schemes``, ``transports``,
``cluster``) and the emulated cluster of network namespaces."""
