"""The mutant catalogue: deliberately defective variants of the reference runtime.

Each mutant plants exactly one known defect by subclassing a runtime component (the
product code carries no defect flags), is registered here by name (the harness registry
exposes it as subject ``defect:<name>``), and says in its docstring what it breaks,
where the defect class comes from, and which oracle check should catch it.
Each class also carries the metadata ``crashmatrix selftest`` reads (``defect``,
``source``, ``caught_by``, ``fault_kinds``, ``point_sources``, ``conversations``,
``workload``, ``baseline``, ``resume_policies``, and for a mutant of a deploy ``crash_with``
and ``build_path``: :mod:`._base`); ``tests/integration/test_selftest.py`` proves
each is caught by a check it names, and that its baseline passes the same cases.
"""

MUTANTS: dict[str, str] = {
    "unkeyed-retry": "crashmatrix.scenarios.defects.runtime_defects:UnkeyedRetryAdapter",
    "unshielded-unknown": "crashmatrix.scenarios.defects.runtime_defects:UnshieldedUnknownAdapter",
    "drain-keeps-launching": "crashmatrix.scenarios.defects.runtime_defects:DrainKeepsLaunchingAdapter",
    "unfenced-lease": "crashmatrix.scenarios.defects.runtime_defects:UnfencedLeaseAdapter",
    "delta-drops-field": "crashmatrix.scenarios.defects.record_defects:DeltaDropsSpawnedAdapter",
    "replays-model-call": "crashmatrix.scenarios.defects.resume_defects:ReplaysModelCallAdapter",
    "outcome-outside-record": "crashmatrix.scenarios.defects.record_defects:OutcomeOutsideRecordAdapter",
    "duplicate-tool-result": "crashmatrix.scenarios.defects.resume_defects:DuplicatesRecoveredResultAdapter",
    "no-unknown-state": "crashmatrix.scenarios.defects.resume_defects:NoUnknownAdapter",
    "pickle-codec": "crashmatrix.scenarios.defects.pickle_codec:PickleCodecAdapter",
    "checkpoint-before-node": "crashmatrix.scenarios.defects.record_defects:CheckpointFirstAdapter",
    "trace-not-stored": "crashmatrix.scenarios.defects.resume_defects:TraceNotStoredAdapter",
    "retention-deletes-paused": "crashmatrix.scenarios.defects.resume_defects:RetentionDeletesPausedAdapter",
    "lagging-durability": "crashmatrix.scenarios.defects.record_defects:LaggingDurabilityAdapter",
    "lost-ack-reapply": "crashmatrix.scenarios.defects.net_defects:LostAckReapplyAdapter",
    "gives-up-on-outage": "crashmatrix.scenarios.defects.outage_defects:GivesUpOnOutageAdapter",
    "double-charge-tool": "crashmatrix.scenarios.defects.golden_defects:DoubleChargeToolAdapter",
    "drain-cancels-in-flight": "crashmatrix.scenarios.defects.drain_defects:DrainCancelsInFlightAdapter",
    "zombie-charges": "crashmatrix.scenarios.defects.recovery_defects:ZombieChargesAdapter",
    "no-attempt-limit": "crashmatrix.scenarios.defects.recovery_defects:NoAttemptLimitAdapter",
    "no-sweep": "crashmatrix.scenarios.defects.recovery_defects:LiveOnlySweepAdapter",
    "fresh-key-retry": "crashmatrix.scenarios.defects.recovery_defects:FreshKeyRetryAdapter",
    "acks-before-write": "crashmatrix.scenarios.defects.recovery_defects:AcksOnReceiptAdapter",
    "pickle-moved-class": "crashmatrix.scenarios.defects.upgrade_defects:PickleMovedClassAdapter",
    "missing-upgrader": "crashmatrix.scenarios.defects.upgrade_defects:MissingUpgraderAdapter",
    "renamed-step": "crashmatrix.scenarios.defects.upgrade_defects:RenamedStepAdapter",
    "restore-forgets-ledger": "crashmatrix.scenarios.defects.restore_defects:RestoreForgetsLedgerAdapter",
    "restore-recalls-model": "crashmatrix.scenarios.defects.restore_defects:RestoreRecallsModelAdapter",
    "restore-to-start": "crashmatrix.scenarios.defects.restore_defects:RestoreToStartAdapter",
    "restore-keeps-tool-results": "crashmatrix.scenarios.defects.restore_defects:RestoreKeepsToolResultsAdapter",
    "fork-moves-original": "crashmatrix.scenarios.defects.restore_defects:ForkMovesOriginalAdapter",
}
