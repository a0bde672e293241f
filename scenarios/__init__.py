"""Workloads, their providers, and the catalogue of mutants (known-defective subjects)."""
