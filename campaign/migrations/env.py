"""Alembic environment of the campaign ledger.

Two ways in:

* from the ledger code (``campaign db upgrade``, first use of a new ledger):
  a connection already inside the caller's locked transaction is passed in
  ``config.attributes["connection"]``; the migrations run inside it.
* from the ``alembic`` command line for developers (``alembic -c alembic.ini
  upgrade head``): the URL comes from ``-x url=...``, ``sqlalchemy.url``,
  ``CAMPAIGN_LEDGER`` or the default ``sqlite:///campaign.db``.
"""

from __future__ import annotations

from alembic import context

from campaign.ledger.connections import create_ledger_engine, parse_url, write_connection
from campaign.ledger.location import resolve_url
from campaign.ledger.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    engine = create_ledger_engine(parse_url(resolve_url(url)))
    try:
        with write_connection(engine) as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    url = parse_url(resolve_url(config.get_main_option("sqlalchemy.url")))
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
