"""A user's property test: fuzz the resume paths of a runtime with a planted defect
(idempotency keys that change per attempt) with up to two kills per plan."""

from crashmatrix.harness.fuzz import resume_property

test_resume_paths = resume_property(
    "checkout", subject="defect:unkeyed-retry", conversation="conv1",
    kinds=("kill",), sources=("label",), max_faults=2, max_examples=60)
