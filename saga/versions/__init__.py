"""Definition versions: compatibility rules, the registry of shapes in Redis, migrations.

See docs/versioning.md.
"""
