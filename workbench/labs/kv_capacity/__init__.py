"""The kv-capacity lab."""
