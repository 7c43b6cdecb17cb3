"""The non-prefix-reuse lab."""
