"""Builds for two-build matrices: the deploy between a crash and its resume.

A case may crash under build A and resume under build B
(``crashmatrix run WORKLOAD --subject A --resume-with B``, :mod:`crashmatrix.harness.builds`).
This package holds the builds the project's own pairs use, registered as subjects by
name (:data:`BUILDS`, merged into the registry):

- ``reference-next`` (:mod:`.builds`): the reference runtime's next build, payload
  format 2 with its upgrader (:mod:`.wire`): ``reference`` -> ``reference-next`` is the
  clean pair (its wall: format versions and upgraders);
- ``shop-*`` (:mod:`.shop`): the ``upgrade_shop`` workload's agent after one change each
  (a renamed state class, a field moved with an upgrader, a field dropped without one, a
  model call added before an existing one).

The upgrade defects (a pickled class moved between two source trees, an upgrader
missing for one version, a step renamed) are mutants of the catalogue
(:mod:`crashmatrix.scenarios.defects.upgrade_defects`).
"""

BUILDS: dict[str, str] = {
    "reference-next": "crashmatrix.scenarios.upgrades.builds:NextBuildAdapter",
    **{name: f"crashmatrix.scenarios.upgrades.shop:{cls}" for name, cls in (
        ("shop-v1", "ShopV1Build"), ("shop-renamed", "ShopRenamedBuild"), ("shop-folded", "ShopFoldedBuild"),
        ("shop-dropped", "ShopDroppedBuild"), ("shop-review", "ShopReviewBuild"))},
}
"""Registry name -> ``module:AdapterClass`` of each build here."""
