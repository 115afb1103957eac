#!/usr/bin/env python3
"""A fenced write to a Delta Lake table (delta-rs, the `deltalake` package).

    leaseagent --task nightly-export -- python3 examples/delta-fenced-write.py /data/events 2026-12-01

Overwrites the partition `part = PARTITION_VALUE` of the Delta table at
TABLE_URI with a few rows stamped with the fencing token (`LEASE_TOKEN`), and
records the token in the SAME commit as an application transaction (the Delta
protocol's `txn` action: appId = `LEASE_TASK`, version = the token). The table
is created (partitioned by `part`) when it does not exist.

Why a zombie cannot commit over a newer attempt:

1. The script loads the table once, at some version V, and reads the highest
   token recorded for the task from that snapshot (`transaction_version`). A
   token at least as high refuses the write up front (exit 3).
2. The commit is made from that same snapshot, so its read version is V, with
   `max_commit_retries=0`: delta-rs may only write log entry V+1, which the
   log store creates with put-if-absent. If anything committed since V, the
   commit fails instead of being rebased onto the newer table (delta-rs
   rebases by default, and treats two blind appends as no conflict, which
   would carry a stale token past a newer one). Independently of that
   setting, delta-rs's conflict checker refuses a commit whose `txn` appId
   also appears in a commit it did not read ("Concurrent transaction
   failed"). The check in 1 and the commit are therefore one optimistic
   transaction: whatever the check read is still the table's state when the
   commit lands.
3. After a failed commit the script reloads the table and starts over from 1,
   so a retry always re-reads the token: a newer attempt's commit turns the
   retry into a refusal (exit 3); an unrelated commit (another task's
   partition) just costs a retry. Bounded by ATTEMPTS.

Not covered (see docs/fencing.md): readers that look at files before they
are committed, and data files a refused commit had already written (not in
the log, so invisible to readers; `vacuum` removes them). A refused commit
leaves the table's log exactly as it was.

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

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SUPERSEDED = 3
ATTEMPTS = 10
# The txn version is a signed 64-bit long in the Delta protocol.
MAX_TOKEN = 2**63 - 1
# Partition values go into a SQL predicate: keep them to a plain alphabet.
PARTITION_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
NAME = "delta-fenced-write"


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
        die(EXIT_USAGE, "LEASE_TASK is not set (or not printable): it is the Delta txn appId")
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


def main(argv):
    if len(argv) != 3:
        die(EXIT_USAGE, "usage: delta-fenced-write.py TABLE_URI PARTITION_VALUE")
    uri, part = argv[1], argv[2]
    if not PARTITION_RE.fullmatch(part):
        die(EXIT_USAGE, f"PARTITION_VALUE {part!r}: use 1-128 of A-Z a-z 0-9 _ . : -")
    task, token = lease_from_env()

    # Imported after the argument checks so a usage error is fast and clear.
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError, TableNotFoundError

    schema = pa.schema([("part", pa.string()), ("token", pa.int64()), ("row", pa.int64())])

    def open_table():
        try:
            return DeltaTable(uri)
        except TableNotFoundError:
            pass
        try:
            DeltaTable.create(uri, schema=schema, partition_by=["part"], mode="ignore")
        except CommitFailedError:
            pass  # another writer created it first: load theirs
        return DeltaTable(uri)

    # The work itself (a stand-in): a few rows stamped with the token.
    rows = pa.table(
        {"part": [part] * 3, "token": [token] * 3, "row": [1, 2, 3]}, schema=schema
    )
    last_error = None
    for attempt in range(ATTEMPTS):
        table = open_table()
        seen = table.transaction_version(task)
        if seen is not None and seen >= token:
            die(
                EXIT_SUPERSEDED,
                f"token {token} superseded by {seen} (recorded for task {task!r} "
                f"in {uri} at version {table.version()}); nothing committed"
                + (" (the table refused this attempt's commit)" if last_error else ""),
            )
        if attempt == 0:
            pause_for_test()
        try:
            write_deltalake(
                table,  # commit from the snapshot the check read
                rows,
                mode="overwrite",
                predicate=f"part = '{part}'",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(task, token)],
                    max_commit_retries=0,
                    custom_metadata={"leaseagent.task": task, "leaseagent.token": str(token)},
                ),
            )
        except CommitFailedError as e:
            last_error = e  # the table moved since the check: check again
            continue
        print(f"{NAME}: committed token {token} for task {task!r} to {uri} partition {part}")
        return 0
    die(EXIT_FAILED, f"gave up after {ATTEMPTS} conflicting commits on {uri}: {last_error}")


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
