"""Alembic environment: always run on the connection handed over by the metadata store."""

from alembic import context

from offloader.metadata.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
