"""``parsearch store copy SRC DST``: every row of a store into a new one, SQLite or PostgreSQL.

A centre moves a campaign directory's SQLite file into its shared server (or takes a
server's campaigns home in one file) without losing anything a report, a resume or an audit
reads: every campaign with its settings and versions, every trial with its metrics and log
tail, each lease and its generation, and the schema's own history. Rows keep their ids, so
trial ids printed in old reports still name the same trials. Both stores hold the same
tables (see :mod:`.postgres`), floats as doubles and JSON as the text the store wrote, so the
copy is exact: a round trip gives back the same rows.
"""

from __future__ import annotations

from parsearch.errors import StoreError
from parsearch.store import open_store
from parsearch.store.postgres import PostgreSQLStore
from parsearch.store.sqlite import SQLiteStore

# Parents before children, so each row's foreign key exists when it is written.
TABLES = ("schema_version", "campaigns", "trials", "leases")


def copy_store(source: str, destination: str) -> dict[str, int]:
    """Copy every row of ``source`` into ``destination``, a new or empty store; return how
    many rows of each table were copied.

    The source is read in one snapshot (a driver may be writing it) and the destination is
    written in one transaction, so a failed copy leaves it without a single copied row.
    """
    with open_store(source, readonly=True) as reader, open_store(destination) as writer:
        assert isinstance(reader, SQLiteStore) and isinstance(writer, SQLiteStore)
        with reader._transaction("reading every row to copy", write=False) as conn:
            tables = {}
            for table in TABLES:
                cursor = conn.execute(f"SELECT * FROM {table} ORDER BY 1")
                columns = [column[0] for column in cursor.description]
                tables[table] = (columns, cursor.fetchall())
        copied: dict[str, int] = {}
        with writer._transaction(f"copying the rows of {reader.path}") as conn:
            writer._db.serialise()
            held = conn.execute("SELECT COUNT(*) FROM campaigns").fetchone()
            if held and held[0]:
                raise StoreError(
                    f"store {writer.path} already holds {held[0]} campaigns; copy into a new "
                    "store (a new file, or an empty PostgreSQL database or schema)"
                )
            # The destination's own history is the one it was created with; the source's
            # (which release made it, and when) is what the copy keeps.
            conn.execute("DELETE FROM schema_version")
            for table, (columns, rows) in tables.items():
                marks = ", ".join("?" * len(columns))
                insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
                for row in rows:
                    conn.execute(insert, row)
                copied[table] = len(rows)
            if isinstance(writer, PostgreSQLStore):
                writer.continue_ids(conn)
    return copied
