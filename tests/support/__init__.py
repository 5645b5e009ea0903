"""What the tests share, one module a topic; imported as ``support.<module>`` (pytest puts tests/
on sys.path for its conftest.py; tests/ itself is not a package)."""
