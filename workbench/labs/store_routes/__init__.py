"""The store-routes lab."""
