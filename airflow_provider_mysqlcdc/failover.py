"""Following a failover: the stream resumes on another server by GTID set, never by file:pos.

Every offset the stream and the snapshot record carries the identity of the server whose binlog
it names and the GTID set behind it (``core/offset.py``). When the connection now reaches another
server — the old primary died and a replica was promoted, or the address moved — the restart
offset's file:pos names nothing there (at best an unrelated point of a file of the same name). So
before a plan, a finalize or a stream start uses it, :func:`follow_failover` translates the
stream's restart offset and every offset of the manifest onto this server by their GTID sets
(``mysql/gtid_positions.position_of``) and starts a new stream generation from there: the old
checkpoint is never read again. docs/architecture.md, "Offsets and failover".
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_mysqlcdc.core.gtid import GtidSet, GtidSetError
from airflow_provider_mysqlcdc.core.manifest import CapturedTable, Manifest
from airflow_provider_mysqlcdc.core.offset import BinlogOffset
from airflow_provider_mysqlcdc.mysql import server as source_server
from airflow_provider_mysqlcdc.mysql.gtid_positions import GtidPositionError, positions_of
from airflow_provider_mysqlcdc.state import StateStore
from airflow_provider_mysqlcdc.stream.control import checkpoint_offset, request_stop, stream_state

log = logging.getLogger(__name__)


class FailoverError(RuntimeError):
    """The stream cannot resume on this server; the message names the fix."""


def follow_failover(conn: Any, store: StateStore, stop_timeout: float = 300.0, stop_stream: bool = True
                    ) -> Manifest | None:  # fmt: skip
    """The pipeline's manifest, rebased onto the server ``conn`` reaches if its restart offset was
    written by another server (and written back); unchanged otherwise. None: nothing captured yet.
    A stream still running against the old server is stopped first (``stop_stream``; the stream
    job itself, starting, passes False)."""
    manifest = store.read_manifest()
    if manifest is None:
        return None
    restart = checkpoint_offset(store, manifest) or manifest.start_offset
    info = source_server.server_info(conn)
    here = source_server.server_identity(conn, info)
    if restart.server is None or restart.server == here:
        return manifest
    log.warning("failover: the stream's restart offset %s was written by server %s; the connection now reaches %s. "
                "Translating the stream's offsets by GTID set", restart, restart.server, here)  # fmt: skip
    if stop_stream and stream_state(store)["running"]:
        log.warning("failover: stopping the stream, which still runs against the old server")
        request_stop(store, timeout=stop_timeout)
    # offsets not behind the restart point (chunks' HWs the stream had not passed): each by its own set
    pending = [o for o in manifest.offsets() if o.server != here and not _behind(o, restart)]
    table = _translations(conn, [restart, *pending], here, info)
    new_start = table[restart.gtid_set or ""]

    def translate(o: BinlogOffset) -> BinlogOffset:
        if o.server == here:
            return o
        if _behind(o, restart):
            return new_start  # applied before the restart point: behind it on this server too
        return table[o.gtid_set or ""]

    rebased = manifest.rebased(store.pipeline_id, translate)
    store.write_manifest(rebased)
    log.warning("failover: the stream resumes on %s at %s (GTID set %s), generation %d, checkpoint %s", here,
                rebased.start_offset, new_start.gtid_set, rebased.generation.number,
                rebased.generation.checkpoint)  # fmt: skip
    return rebased


def _behind(o: BinlogOffset, restart: BinlogOffset) -> bool:
    """Whether ``o`` lies at or before the restart point in the binlog both name (an offset with no
    server recorded was written before identities were: by the restart point's server)."""
    return o.server in (restart.server, None) and o <= restart


def offsets_here(conn: Any, tables: dict[str, CapturedTable]) -> dict[str, CapturedTable]:
    """``tables`` (a finished snapshot's) with every offset another server wrote translated onto
    this one: groups of one snapshot that ran before and after a failover."""
    info = source_server.server_info(conn)
    here = source_server.server_identity(conn, info)
    foreign = [o for t in tables.values() for o in t.offsets() if o.server not in (here, None)]
    if not foreign:
        return tables
    table = _translations(conn, foreign, here, info)
    log.warning("failover: %d snapshot offsets written by another server translated onto %s", len(foreign), here)

    def translate(o: BinlogOffset) -> BinlogOffset:
        return o if o.server in (here, None) else table[o.gtid_set or ""]

    return {name: t.rebased(translate) for name, t in tables.items()}


def _translations(conn: Any, offsets: list[BinlogOffset], here: str, info: source_server.ServerInfo
                  ) -> dict[str, BinlogOffset]:  # fmt: skip
    """GTID set text -> its position on this server, for every offset (one binlog read for all)."""
    for offset in offsets:
        if not offset.gtid_set:
            raise FailoverError(
                f"the stream's offset {offset} was written by server {offset.server} without a GTID set, and the "
                f"connection now reaches server {here}: a file:pos of one server means nothing on another. Turn "
                "GTID mode on (MySQL: gtid_mode=ON, enforce_gtid_consistency=ON) so offsets survive a failover; to "
                "resume now, re-snapshot every captured table (trigger the DAG with recover_purged=true)"
            )
    texts = sorted({str(o.gtid_set) for o in offsets})
    try:
        targets = [GtidSet.parse(t, info.is_mariadb) for t in texts]
        return dict(zip(texts, positions_of(conn, targets, here, info), strict=True))
    except (GtidSetError, GtidPositionError) as exc:
        raise FailoverError(f"the stream cannot resume on server {here} after a failover: {exc}") from None
