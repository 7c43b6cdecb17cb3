"""What several labs share: the lab protocol, the record, the rigs and the report helpers."""
