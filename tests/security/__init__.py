"""Security: Redis ACL users, TLS, payload limits."""
