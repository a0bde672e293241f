"""The mutant catalogue: deliberately defective variants of the reference runtime.

Each mutant plants exactly one known defect by subclassing a runtime component (the
product code carries no defect flags), is registered here by name (the harness registry
exposes it as subject ``defect:<name>``), and says in its docstring what it breaks,
where the defect class comes from, and which oracle check should catch it.
``tests/test_mutants.py`` proves each is caught.
"""

MUTANTS: dict[str, str] = {
    "unkeyed-retry": "crashmatrix.scenarios.defects.runtime_defects:UnkeyedRetryAdapter",
    "unshielded-unknown": "crashmatrix.scenarios.defects.runtime_defects:UnshieldedUnknownAdapter",
    "drain-keeps-launching": "crashmatrix.scenarios.defects.runtime_defects:DrainKeepsLaunchingAdapter",
    "unfenced-lease": "crashmatrix.scenarios.defects.runtime_defects:UnfencedLeaseAdapter",
    "lost-ack-reapply": "crashmatrix.scenarios.defects.net_defects:LostAckReapplyAdapter",
}
