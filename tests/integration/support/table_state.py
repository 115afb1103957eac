"""Prints what a fenced table holds for one task and partition, as JSON.

    table_state.py delta   TABLE_URI              TASK PART
    table_state.py iceberg WAREHOUSE_DIR TABLE    TASK PART

{"history": [tokens recorded for TASK, in commit order], "rows": [token column of PART's rows]}

Delta: the history comes from the log files themselves (`_delta_log/*.json`,
the `txn` action of TASK in each commit), not from the library, so the test
checks what is on disk. Iceberg: the summaries of `main`'s snapshots, oldest
first (an overwrite commit adds two snapshots, a delete and an append, both
stamped with the same token).
"""

import json
import os
import sys


def delta(uri, task, part):
    from deltalake import DeltaTable

    log = os.path.join(uri, "_delta_log")
    history = []
    for name in sorted(n for n in os.listdir(log) if n.endswith(".json")):
        with open(os.path.join(log, name)) as f:
            for line in f:
                txn = json.loads(line).get("txn")
                if txn and txn.get("appId") == task:
                    history.append(int(txn["version"]))
    rows = DeltaTable(uri).to_pyarrow_table(filters=[("part", "=", part)]).column("token").to_pylist()
    return history, rows


def iceberg(warehouse, table, task, part):
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import EqualTo
    from pyiceberg.table.snapshots import ancestors_of

    catalog = SqlCatalog("default", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    t = catalog.load_table(table)
    history = []
    for snap in reversed(list(ancestors_of(t.current_snapshot(), t.metadata))):
        summary = snap.summary.additional_properties if snap.summary else {}
        if summary.get("leaseagent.task") == task:
            history.append(int(summary["leaseagent.token"]))
    rows = t.scan(row_filter=EqualTo("part", part)).to_arrow().column("token").to_pylist()
    return history, rows


if __name__ == "__main__":
    fmt, rest = sys.argv[1], sys.argv[2:]
    history, rows = delta(*rest) if fmt == "delta" else iceberg(*rest)
    print(json.dumps({"history": history, "rows": rows}), flush=True)
    # Skip the interpreter's teardown, which the Arrow/Rust thread pools
    # occasionally abort ("terminate called without an active exception").
    os._exit(0)
