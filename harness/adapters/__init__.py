"""Adapters for subjects: :mod:`.reference` for the reference runtime."""
