"""The control-groups lab."""
