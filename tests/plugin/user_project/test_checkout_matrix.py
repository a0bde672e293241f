"""A user's matrix test: the checkout workload on the reference runtime, killed,
SIGTERMed and cancelled at every crash point (a slice of it: see pytest.ini)."""

import pytest


@pytest.mark.crashmatrix("checkout", subject="reference", conversations=["conv1"])
def test_checkout(crashmatrix_case):
    crashmatrix_case.check()
