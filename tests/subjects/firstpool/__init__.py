"""An adapter that keeps one pool for its controller-side reads, made from the first
``env.dsn`` it saw (correct by docs/adapters.md: an adapter's pool lives until ``aclose``)."""
