"""The pd-split lab."""
