"""The same-engine-pair lab."""
