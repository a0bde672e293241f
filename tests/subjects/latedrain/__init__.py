"""Reference-runtime variants whose SIGTERM handler runs, or records, late."""
