"""The SQLite reference backend: the schema (`schema.py`) and the backend (`backend.py`) that the
other backends are held to, and that the serving index reuses on its own file."""
