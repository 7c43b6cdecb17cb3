"""The tp-pp lab."""
