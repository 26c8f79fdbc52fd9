"""What moving an epoch costs, without torch: the wire format's sizes (:mod:`.wire`), link
rates (:mod:`.rates`) and every transport's cost model under a topology (:mod:`.model`),
which ``coded-shuffle predict`` evaluates for clusters this machine cannot emulate
(docs/transports.md, "Predictions").

The layer sits between the math (plans, loads) and the transports, which take their framing
and datagram sizes from here: one home for the arithmetic that both count with.
"""
