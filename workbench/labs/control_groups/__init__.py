"""The control-groups lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.control_groups.lab import ControlGroupsLab

__all__ = ["ControlGroupsLab"]
