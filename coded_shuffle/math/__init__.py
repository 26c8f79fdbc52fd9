"""The math layer: assignments, delivery plans, cache states, the schemes, lower bounds,
rate-memory curves and the GF(2) index decoder, on integer index arrays.

numpy and scipy only: it imports and plans without torch (``tests/test_layers.py``).
"""
