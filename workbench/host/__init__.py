"""Host-memory backend: Linux virtual memory (mmap + memfd) behind the device interface."""
