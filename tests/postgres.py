"""A real PostgreSQL for the tests: ``postgres_server`` (one per session) and ``postgres_url`` (a fresh database
on it per test).

The server is :class:`benchmarks.servers.PostgresServer` (initdb and pg_ctl in a temporary folder, on
127.0.0.1 and a free port; the production phase of ``benchmarks/serve_load.py`` starts the same one).
Without the binaries, or psycopg, the tests that need the server skip and say why.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.servers import PostgresServer, PostgresUnavailable, free_port

__all__ = ["free_port", "postgres_server", "postgres_url"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database()
