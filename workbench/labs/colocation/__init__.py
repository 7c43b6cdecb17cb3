"""The colocation lab (:mod:`.lab`: the Lab, its checks and its report; :mod:`.params` below the
runners :mod:`.sim`, :mod:`.mini` and :mod:`.server`)."""

from workbench.labs.colocation.lab import ColocationLab

__all__ = ["ColocationLab"]
