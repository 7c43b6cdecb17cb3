"""The idle-footprint lab."""
