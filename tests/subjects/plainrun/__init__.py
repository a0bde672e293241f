"""plainrun: a tiny durable runtime that has never heard of crashmatrix.

It runs three payment steps per run against the payment provider, with the usual walls
(an effect row before the call, its final status committed with the step's record, an
``unknown`` row written inside a shield on cancellation), and no ``crashpoint()`` call
anywhere: the harness finds its crash points from its await points alone.
"""
