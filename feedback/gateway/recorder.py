"""Logging off the response's critical path.

The gateway hands each finished exchange to `Recorder.submit`, which only puts it on a
bounded in-process queue. One background thread takes what has accumulated (up to a batch)
and writes it in one transaction (`exchanges_record`: COPY for the messages). Under load the
batches grow by themselves; when idle a record is written within milliseconds.

When the queue is full (the database is slower than the traffic, or down) the exchange is
appended to a spill file (`DATA_DIR/gateway-spill/`, one JSON line each) instead of being
dropped or making the client wait; spill files — also those a crashed process left — are
written to the database when the queue is idle again. A batch that keeps failing on a
database error goes to the spill file too; an exchange that fails on its own data is kept in
`failed-<pid>.jsonl` beside them, with the error in the log. A spill line that cannot be read
back (a process killed mid-write leaves a truncated one) is moved to `quarantine-<pid>.jsonl`
and the rest of its file is written; so is a spilled exchange that fails on its own data (its
deployment was deleted meanwhile, say), with the error in the log, once it has failed alone.
Only the database being unavailable leaves a spill file to be tried again later.

The writer thread is supervised: an unexpected error in one pass is logged and the loop goes
on, and a thread that ended anyway is restarted by the next `submit` or `health` call.
`health()` reports whether it runs, the queue's depth and what was spilled or quarantined
(the gateway serves it at `GET /v1/health`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from pathlib import Path

import orjson
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, connection
from django.utils import timezone

from feedback.gateway.exchange import Exchange
from feedback.services.capture import TraceDigestCache, exchanges_record
from feedback.services.stitching import conversation_tips_expire
from webapp.kernel.ids import parse_id

logger = logging.getLogger(__name__)

_STOP = object()


def _pid(text: str) -> int:
    """The process id a spill file's name carries, or -1 when the name holds none."""
    return parse_id(text) if parse_id(text) is not None else -1


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Recorder:
    def __init__(self, *, queue_size: int, batch_size: int, spill_dir: Path) -> None:
        self.batch_size = batch_size
        self.spill_dir = spill_dir
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._spill_lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0
        self._cache = TraceDigestCache()
        self.stats = {
            "submitted": 0,
            "written": 0,
            "spilled": 0,
            "failed": 0,
            "batches": 0,
            "quarantined": 0,
            "writer_errors": 0,
            "writer_restarts": 0,
        }
        self._stopping = False
        self._last_replay = 0.0
        self._last_expiry = time.monotonic()

    # -- the event loop's side: never blocks on the database ------------------------------------

    def expect(self) -> None:
        """Count an exchange that is still in flight, so `drain` also waits for it (a streamed
        response may end at the client before the server side has submitted its exchange)."""
        with self._idle:
            self._pending += 1

    def submit(self, exchange: Exchange, *, expected: bool = False) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            self.start()
        if not expected:
            with self._idle:
                self._pending += 1
        self.stats["submitted"] += 1
        try:
            self._queue.put_nowait(exchange)
        except queue.Full:
            self._spill([exchange])
            self._done(1)

    def start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                if self._thread is not None and not self._stopping:
                    self.stats["writer_restarts"] += 1
                    logger.error("gateway log: the writer thread had ended; restarted")
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="gateway-recorder", daemon=True)
                self._thread.start()

    def health(self) -> dict:
        """The writer's state for a health check; restarts a writer that has ended."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stopping:
            self.start()
        spill_files = 0
        if self.spill_dir.is_dir():
            spill_files = sum(1 for p in self.spill_dir.glob("*.jsonl") if p.name.startswith(("spill-", "claimed-")))
        depth = self._queue.qsize()
        alive = self._thread is not None and self._thread.is_alive()
        return {
            "status": "ok" if alive and depth < self._queue.maxsize else "degraded",
            "writer_alive": alive,
            "queue_depth": depth,
            "queue_size": self._queue.maxsize,
            "in_flight": self._pending,
            "spill_files": spill_files,
            **self.stats,
        }

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far is written (or spilled); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self, timeout: float = 15.0) -> None:
        """Write what is queued, then end the thread (on server shutdown)."""
        if self._thread is None:
            return
        self.drain(timeout)
        self._stopping = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    # -- the writer thread --------------------------------------------------------------------

    def _done(self, n: int) -> None:
        with self._idle:
            self._pending -= n
            if self._pending <= 0:
                self._idle.notify_all()

    def _run(self) -> None:
        self._last_replay = 0.0
        try:
            while True:
                try:
                    if not self._step():
                        break
                except Exception:
                    # Supervision: one bad pass (a bug, an unreadable file) must not end the
                    # writer, or every later exchange would wait in memory forever.
                    self.stats["writer_errors"] += 1
                    logger.exception("gateway log: the writer's pass failed; carrying on")
                    connection.close()
                    time.sleep(0.2)
        finally:
            connection.close()

    def _step(self) -> bool:
        """One pass: write what is queued (up to a batch), or replay spill files when idle.
        False when told to stop."""
        if time.monotonic() - self._last_expiry > 60:  # also under constant load
            self._last_expiry = time.monotonic()
            connection.close_if_unusable_or_obsolete()
            conversation_tips_expire(now=timezone.now())
        try:
            first = self._queue.get(timeout=0.5)
        except queue.Empty:
            if time.monotonic() - self._last_replay > 5:
                self._last_replay = time.monotonic()
                self._replay_spills()
            return True
        if first is _STOP:
            return False
        batch = [first]
        stop = False
        while len(batch) < self.batch_size:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stop = True
                break
            batch.append(item)
        try:
            self._write(batch)
        finally:
            self._done(len(batch))
        return not stop

    def _write(self, batch: list[Exchange]) -> bool:
        """Write a batch; True when it reached the database."""
        delay = 0.2
        for attempt in range(4):
            try:
                connection.close_if_unusable_or_obsolete()
                exchanges_record(exchanges=batch, cache=self._cache)
                self.stats["written"] += len(batch)
                self.stats["batches"] += 1
                return True
            except IntegrityError:
                # Another process created one of these traces first; the next pass sees it.
                if attempt:
                    break
            except (OperationalError, InterfaceError):
                logger.warning("gateway log: database unavailable (attempt %d)", attempt + 1, exc_info=True)
                connection.close()
                time.sleep(delay)
                delay *= 3
                continue
            except DatabaseError:
                break
            except Exception:
                logger.exception("gateway log: unexpected error writing %d exchanges", len(batch))
                break
        if len(batch) > 1:
            # Isolate the exchange that fails on its own data; the others are written.
            ok = True
            for exchange in batch:
                ok = self._write_one(exchange) and ok
            return ok
        return self._write_one(batch[0])

    def _write_one(self, exchange: Exchange) -> bool:
        try:
            connection.close_if_unusable_or_obsolete()
            exchanges_record(exchanges=[exchange], cache=self._cache)
            self.stats["written"] += 1
            return True
        except (OperationalError, InterfaceError):
            connection.close()
            self._spill([exchange])
        except Exception:
            logger.exception("gateway log: exchange for trace %s could not be written", exchange.trace_key)
            self.stats["failed"] += 1
            self._append(self.spill_dir / f"failed-{os.getpid()}.jsonl", [exchange])
        return False

    # -- spill files ----------------------------------------------------------------------------

    def _append(self, path: Path, exchanges: list[Exchange]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(orjson.dumps(e.to_json(), default=str) + b"\n" for e in exchanges)
        with self._spill_lock, path.open("ab") as f:
            f.write(data)

    def _spill(self, exchanges: list[Exchange]) -> None:
        self.stats["spilled"] += len(exchanges)
        logger.warning("gateway log: %d exchange(s) spilled to %s", len(exchanges), self.spill_dir)
        self._append(self.spill_dir / f"spill-{os.getpid()}.jsonl", exchanges)

    def _claim_spills(self) -> list[Path]:
        if not self.spill_dir.is_dir():
            return []
        claimed = []
        me = os.getpid()
        for path in sorted(self.spill_dir.iterdir()):
            name = path.name
            if name.startswith("spill-") and name.endswith(".jsonl"):
                pid = _pid(name[6:-6])
                if pid != me and _pid_alive(pid):
                    continue
            elif name.startswith("claimed-") and name.endswith(".jsonl"):
                pid_part = name.split("-")[1]
                pid = _pid(pid_part)
                if pid != me and _pid_alive(pid):
                    continue
            else:
                continue
            target = self.spill_dir / f"claimed-{me}-{uuid.uuid4().hex[:8]}.jsonl"
            try:
                with self._spill_lock:
                    path.rename(target)
            except FileNotFoundError:
                continue  # another process claimed it first
            claimed.append(target)
        return claimed

    def _quarantine(self, source: Path, lines: list[tuple[bytes, Exception]], what: str = "an unreadable line") -> None:
        self.stats["quarantined"] += len(lines)
        for _, exc in lines:
            logger.error("gateway log: %s in %s was quarantined (%s)", what, source.name, exc)
        target = self.spill_dir / f"quarantine-{os.getpid()}.jsonl"
        with self._spill_lock, target.open("ab") as f:
            f.write(b"".join(line + b"\n" for line, _ in lines))

    def _replay_one_by_one(self, path: Path, chunk: list[Exchange]) -> tuple[int, Exception] | None:
        """Write the chunk's exchanges one at a time; one that fails on its own data (twice:
        the first failure may be a race with another process) is quarantined. Returns None
        when the chunk is done, or the index from which it must wait for the database, and why."""
        for index, exchange in enumerate(chunk):
            for attempt in range(2):
                try:
                    connection.close_if_unusable_or_obsolete()
                    exchanges_record(exchanges=[exchange], cache=self._cache)
                    self.stats["written"] += 1
                    break
                except (OperationalError, InterfaceError) as exc:
                    return index, exc
                except Exception as exc:
                    if attempt:
                        line = orjson.dumps(exchange.to_json(), default=str)
                        self._quarantine(path, [(line, exc)], what=f"an exchange for trace {exchange.trace_key!r}")
        return None

    def _replay_spills(self) -> None:
        for path in self._claim_spills():
            exchanges, bad = [], []
            for line in path.read_bytes().splitlines():
                if not line.strip():
                    continue
                try:
                    exchanges.append(Exchange.from_json(orjson.loads(line)))
                except Exception as exc:  # truncated or otherwise unreadable: keep it aside
                    bad.append((line, exc))
            if bad:
                self._quarantine(path, bad)
            written = True
            for start in range(0, len(exchanges), self.batch_size):
                chunk = exchanges[start : start + self.batch_size]
                try:
                    connection.close_if_unusable_or_obsolete()
                    exchanges_record(exchanges=chunk, cache=self._cache)
                    self.stats["written"] += len(chunk)
                    continue
                except (OperationalError, InterfaceError) as exc:
                    later, failure = 0, exc  # the database is unavailable: the whole rest waits
                except Exception:
                    # One exchange of the chunk may fail on its own data: try them one by one.
                    found = self._replay_one_by_one(path, chunk)
                    if found is None:
                        continue
                    later, failure = found
                logger.warning("gateway log: replaying %s failed; will retry (%s)", path.name, failure)
                connection.close()
                rest = exchanges[start + later :]
                path.write_bytes(b"".join(orjson.dumps(e.to_json(), default=str) + b"\n" for e in rest))
                written = False
                break
            if written:
                path.unlink(missing_ok=True)
                logger.info("gateway log: replayed %d spilled exchange(s) from %s", len(exchanges), path.name)
