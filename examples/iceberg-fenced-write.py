#!/usr/bin/env python3
"""A fenced write to an Apache Iceberg table (the `pyiceberg` package).

    leaseagent --task nightly-export -- python3 examples/iceberg-fenced-write.py /data/warehouse db.events 2026-12-01

Uses pyiceberg's SQL catalog named `default` at sqlite:///WAREHOUSE_DIR/catalog.db
with the warehouse file://WAREHOUSE_DIR; TABLE is `namespace.name`, and the
namespace and table (partitioned by `part`) are created when missing. Overwrites
the partition `part = PARTITION_VALUE` with a few rows stamped with the
fencing token (`LEASE_TOKEN`), and records the token in the same commit: in the
summary of the snapshot(s) the commit adds (`leaseagent.token`, with
`leaseagent.task`), and in the table property `leaseagent.token.<task>`, which
survives snapshot expiry.

Why a zombie cannot commit over a newer attempt:

1. The script loads the table once and reads the highest token recorded for
   the task (`LEASE_TASK`) in that metadata: the table property and the
   summaries of the snapshots of `main`'s history. A token at least as high
   refuses the write up front (exit 3).
2. The commit carries Iceberg's commit requirement AssertRefSnapshotId: `main`
   must still point at the snapshot the check read (or still not exist, for
   an empty table). The catalog validates the requirements against its
   current metadata and swaps the metadata pointer only if it is unchanged
   (the SQL catalog: UPDATE ... WHERE metadata_location = the one it
   validated). Check and commit are therefore one atomic catalog operation:
   if anything committed since the read, the commit fails.
3. pyiceberg retries a failed commit by default by REBUILDING it on the
   refreshed table and dropping that requirement, which would carry a stale
   token past a newer one. This script sets the retry count to 0 for its own
   commit only (the table's stored properties are not changed), and after a
   failed commit reloads the table and starts over from 1, so every retry
   re-reads the token: a newer attempt's commit turns the retry into a
   refusal (exit 3). Bounded by ATTEMPTS.

Not covered (see docs/fencing.md): readers that look at data files before
they are committed, and files of a commit that was refused after writing
them (pyiceberg deletes them on a refused commit; a crash can leave them:
orphan-file removal cleans them). A refused commit leaves the table's
metadata exactly as it was.

Exit status: 0 committed; 3 superseded (one line on stderr naming the token
seen, the table unchanged); 2 bad arguments or environment; 1 any other
failure (the message says which).

Test hook (not for production): when LEASEAGENT_TEST_PAUSE_BEFORE_COMMIT
names a file, the script writes its pid there and stops itself (SIGSTOP)
after the token check and before the first commit, so a test can freeze it
at the worst moment and resume it with SIGCONT.
"""

import os
import re
import signal
import sys
import warnings

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SUPERSEDED = 3
ATTEMPTS = 10
MAX_TOKEN = 2**63 - 1
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
PARTITION_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
NAME = "iceberg-fenced-write"
TOKEN_KEY = "leaseagent.token"
TASK_KEY = "leaseagent.task"


def die(code, message):
    print(f"{NAME}: {message}", file=sys.stderr)
    sys.exit(code)


def lease_from_env():
    """(task, token) from the agent's environment, strictly parsed."""
    task = os.environ.get("LEASE_TASK", "")
    raw = os.environ.get("LEASE_TOKEN")
    if raw is None:
        die(EXIT_USAGE, "LEASE_TOKEN is not set: run me under leaseagent (leaseagent --task T -- ...)")
    if not re.fullmatch(r"[0-9]{1,20}", raw) or int(raw) > MAX_TOKEN:
        die(EXIT_USAGE, f"LEASE_TOKEN {raw!r} is not a decimal token in 0..={MAX_TOKEN}")
    if not task or not task.isprintable():
        die(EXIT_USAGE, "LEASE_TASK is not set (or not printable): tokens are recorded per task")
    return task, int(raw)


def pause_for_test():
    path = os.environ.get("LEASEAGENT_TEST_PAUSE_BEFORE_COMMIT")
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(tmp, path)
    os.kill(os.getpid(), signal.SIGSTOP)


def recorded_token(table, task):
    """The highest token recorded for `task` in this table metadata, or None."""
    from pyiceberg.table.snapshots import ancestors_of

    seen = []
    prop = table.metadata.properties.get(f"{TOKEN_KEY}.{task}")
    if prop is not None:
        seen.append(prop)
    for snap in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snap.summary.additional_properties if snap.summary else {}
        if summary.get(TASK_KEY) == task and TOKEN_KEY in summary:
            seen.append(summary[TOKEN_KEY])
    for value in seen:
        if not re.fullmatch(r"[0-9]{1,20}", value):
            die(EXIT_FAILED, f"recorded token {value!r} for task {task!r} is not a decimal token: refusing to guess")
    return max((int(v) for v in seen), default=None)


def main(argv):
    if len(argv) != 4:
        die(EXIT_USAGE, "usage: iceberg-fenced-write.py WAREHOUSE_DIR TABLE PARTITION_VALUE")
    warehouse, name, part = argv[1], argv[2], argv[3]
    ns, _, tbl = name.partition(".")
    if not (NAME_RE.fullmatch(ns) and NAME_RE.fullmatch(tbl)):
        die(EXIT_USAGE, f"TABLE {name!r}: expected namespace.name, each [A-Za-z_][A-Za-z0-9_]*")
    if not PARTITION_RE.fullmatch(part):
        die(EXIT_USAGE, f"PARTITION_VALUE {part!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
    if not os.path.isdir(warehouse):
        die(EXIT_USAGE, f"WAREHOUSE_DIR {warehouse!r} is not a directory")
    warehouse = os.path.abspath(warehouse)
    task, token = lease_from_env()

    # Imported after the argument checks so a usage error is fast and clear.
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.expressions import EqualTo
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import TableProperties
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    # An overwrite of a partition that has no rows yet is normal here.
    warnings.filterwarnings("ignore", message="Delete operation did not match any records")
    # Two writers that open a new catalog at the same moment both create its
    # own tables: the loser's CREATE TABLE fails ("already exists"). The
    # tables are there then: open it again.
    from sqlalchemy.exc import OperationalError

    for attempt in range(5):
        try:
            catalog = SqlCatalog("default", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
            break
        except OperationalError as e:
            if "already exists" not in str(e) or attempt == 4:
                raise
    schema = Schema(
        NestedField(1, "part", StringType(), required=False),
        NestedField(2, "token", LongType(), required=False),
        NestedField(3, "row", LongType(), required=False),
    )
    spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="part"))
    # Two writers that find the table missing at the same moment both try to
    # create it: the loser's INSERT into the catalog fails (SQLAlchemy's
    # IntegrityError, or pyiceberg's AlreadyExists). The winner's namespace
    # and table are then there: look again rather than fail.
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
    from sqlalchemy.exc import IntegrityError

    for attempt in range(5):
        try:
            catalog.create_namespace_if_not_exists(ns)
            catalog.create_table_if_not_exists(name, schema=schema, partition_spec=spec)
            break
        except (IntegrityError, NamespaceAlreadyExistsError, TableAlreadyExistsError):
            if attempt == 4:
                raise

    # The work itself (a stand-in): a few rows stamped with the token.
    rows = pa.table(
        {"part": [part] * 3, "token": [token] * 3, "row": [1, 2, 3]},
        schema=pa.schema([("part", pa.string()), ("token", pa.int64()), ("row", pa.int64())]),
    )
    stamp = {TOKEN_KEY: str(token), TASK_KEY: task}
    refused = None
    for attempt in range(ATTEMPTS):
        table = catalog.load_table(name)
        seen = recorded_token(table, task)
        if seen is not None and seen >= token:
            die(
                EXIT_SUPERSEDED,
                f"token {token} superseded by {seen} (recorded for task {task!r} in {name}); nothing committed"
                + (" (the catalog refused this attempt's commit)" if refused else ""),
            )
        if attempt == 0:
            pause_for_test()
        # No library retry for this commit: in memory only, never written.
        props = dict(table.metadata.properties)
        props[TableProperties.COMMIT_NUM_RETRIES] = "0"
        table.metadata = table.metadata.model_copy(update={"properties": props})
        tx = table.transaction()
        tx.set_properties({f"{TOKEN_KEY}.{task}": str(token)})
        tx.overwrite(rows, overwrite_filter=EqualTo("part", part), snapshot_properties=stamp)
        try:
            tx.commit_transaction()  # requires main unchanged since the read above
        except CommitFailedException as e:
            refused = e  # the table moved since the check: check again
            continue
        print(f"{NAME}: committed token {token} for task {task!r} to {name} partition {part}")
        return 0
    die(EXIT_FAILED, f"gave up after {ATTEMPTS} conflicting commits on {name}: {refused}")


if __name__ == "__main__":
    try:
        status = main(sys.argv)
    except SystemExit as e:
        status = e.code
    except ImportError as e:
        print(f"{NAME}: {e}: install examples/requirements.txt", file=sys.stderr)
        status = EXIT_FAILED
    except Exception as e:  # one clear line instead of a traceback
        print(f"{NAME}: {type(e).__name__}: {e}", file=sys.stderr)
        status = EXIT_FAILED
    # Exit without the interpreter's teardown: the Arrow/Rust thread pools
    # loaded here occasionally abort it ("terminate called without an active
    # exception", about 1 run in 60 on a busy machine), which would turn a
    # committed write into exit 134.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if isinstance(status, int) else EXIT_FAILED)
