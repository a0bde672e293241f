"""pinned: a subject whose environment holds what crashmatrix's own cannot (protobuf 5,
where crashmatrix needs protobuf 6): plainrun, whose adapter module imports protobuf and
reports the version it found in every observation. It runs in its own virtual
environment (``--subject pinned.adapter:PinnedAdapter@VENV``); the workload
(``plainrun.adapter:WORKLOAD``) imports no protobuf, so the controller reads it too."""
