"""The chaos test: a consumer group of real processes, some SIGKILLed mid-run, checked afterwards.

Used by ``tests/integration/test_chaos.py`` (short, in CI) and
``tests/stress/test_chaos_stress.py`` (``-m stress``). Importable by its bare name because
``tests/`` holds the suite's conftest.py, which pytest's default ``prepend`` import mode puts on
``sys.path``.

:func:`run_chaos` produces keyed records to a topic and starts ``members`` worker processes
(``tests/chaos_worker.py``, a ParallelConsumer in KEY order each) in one group. Then, for each
kill: once the group has recovered from the previous kill (the replacement got its partitions),
has handled its next slice of the records, and at least ``kill_interval`` seconds have passed,
it SIGKILLs a random member and starts a replacement at once. After the last kill the members
finish everything, get SIGTERM and close gracefully. Every process it starts is killed in a
``finally`` block, whatever happened; workers also exit by themselves if the test process dies.

It then reads the workers' logs (format in ``chaos_worker.py``) and the broker, and reports:

* lost: produced records that no member handled;
* the group's committed offsets and the topic's end offsets;
* order violations: within one process, a key's records first handled out of offset order;
* duplicates: handler calls beyond the first per record, and a bound for them.

**The duplicate bound.** A record one member handled runs again elsewhere only if that member
lost the partition (killed, or revoked in a rebalance) before a commit covering it reached the
broker. Each worker logs every 0.1 s the committed offsets the broker acknowledged for its
partitions, and at each revoke (which runs after the library's final commit) the committed
offsets it reads back from the broker. A handled record is *at risk* when no later such reading
by the same process, while it still owned the partition, was above its offset: for a killed
process these are the records it finished after its last acknowledged commit that we saw. The
bound is the at-risk records of every process plus the results each dropped as stale (in flight
when their partition was revoked; the library counts them). It over-estimates: a finished record
above a lower unfinished one is counted even when the commit's offset map covers it, and so is a
record whose commit was acknowledged (or reached the broker) after the last reading before a kill.
Records in flight at a kill never wrote their line, so they are handled once, by the next owner,
and are not duplicates in this count.
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from parallel_consumer.testing import produce_records

WORKER = Path(__file__).with_name("chaos_worker.py")

#: How often waits re-check their condition.
POLL_STEP = 0.05


class ChaosError(AssertionError):
    """The run could not go as planned: a deadline passed or a member failed."""


@dataclass(frozen=True, kw_only=True)
class ChaosPlan:
    records: int
    keys: int
    partitions: int = 6
    members: int = 3
    kills: int
    #: At least this many seconds between two kills (and between the start and the first).
    kill_interval: float = 3.0
    #: Handler threads per member; each call sleeps 0..max_sleep_ms.
    concurrency: int = 8
    max_sleep_ms: float = 2.0
    commit_interval: float = 0.3
    session_timeout_ms: int = 6000
    #: The share of kills that do not wait for the group to recover from the previous one, so
    #: they land inside a rebalance (the victim may be joining, revoking or not started yet).
    kills_in_rebalance: float = 0.0
    #: Seconds allowed for each phase: reaching each kill, the finish, the graceful close.
    phase_timeout: float = 60.0
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))


@dataclass
class Member:
    run: int
    log: Path
    process: subprocess.Popen[bytes]
    killed_at: float | None = None
    #: Lines of its log read so far: did it start (handles SIGTERM), join (got an assignment).
    started: bool = False
    joined: bool = False


@dataclass
class Kill:
    run: int
    seconds: float  # since the members were first started
    handled: int  # records handled by the group so far
    in_rebalance: bool  # did not wait for the group to recover from the previous kill
    at_risk: int = 0  # records the killed process handled that we never saw committed


@dataclass
class ChaosReport:
    plan: ChaosPlan
    folder: Path
    records: int = 0
    kills: list[Kill] = field(default_factory=list)
    runs: int = 0
    lost: int = 0
    unexpected: int = 0
    calls: int = 0
    duplicates: int = 0
    #: Records handled twice by the same process (after it got a partition back).
    duplicates_within_a_process: int = 0
    at_risk_killed: int = 0
    at_risk_survivors: int = 0
    stale: int = 0
    order_violations: list[str] = field(default_factory=list)
    #: Commits seen above a record not handled yet at that moment (never commit past unfinished).
    commits_ahead: list[str] = field(default_factory=list)
    retried_calls: int = 0
    worker_errors: list[str] = field(default_factory=list)
    worker_warnings: list[str] = field(default_factory=list)
    #: Lines the workers printed on stderr: the library's and librdkafka's warnings, tracebacks.
    worker_stderr_lines: int = 0
    #: Chains the members that closed gracefully handed out (statistics().chains).
    chains: int = 0
    committed: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bound(self) -> int:
        return self.at_risk_killed + self.at_risk_survivors + self.stale

    def summary(self) -> str:
        kills = "; ".join(
            f"run {k.run} at {k.seconds:.1f} s{' in a rebalance' if k.in_rebalance else ''} "
            f"({k.handled} handled, {k.at_risk} at risk)"
            for k in self.kills
        )
        return (
            f"chaos seed={self.plan.seed}: {self.records} records, {self.plan.keys} keys, "
            f"{self.plan.partitions} partitions, {self.plan.members} members, "
            f"{len(self.kills)} kills, {self.runs} processes, {self.seconds:.1f} s\n"
            f"  kills: {kills}\n"
            f"  lost {self.lost}, unexpected {self.unexpected}, order violations "
            f"{len(self.order_violations)}, commits ahead of unhandled records "
            f"{len(self.commits_ahead)}, retried calls {self.retried_calls}\n"
            f"  handler calls {self.calls} ({self.chains} chains in the members closed), "
            f"duplicates {self.duplicates} "
            f"({self.duplicates_within_a_process} within one process) <= bound {self.bound} "
            f"(at risk: killed {self.at_risk_killed}, survivors {self.at_risk_survivors}; "
            f"stale results {self.stale})\n"
            f"  committed {self.committed}, end {self.ends}: equal {self.committed == self.ends}\n"
            f"  worker errors {len(self.worker_errors)}, warnings {len(self.worker_warnings)}, "
            f"stderr lines {self.worker_stderr_lines} (run-*.stderr); logs in {self.folder}"
        )


class Group:
    """The worker processes of one run."""

    def __init__(
        self, bootstrap: str, topic: str, group: str, plan: ChaosPlan, folder: Path
    ) -> None:
        self._args = [
            sys.executable,
            str(WORKER),
            f"--bootstrap={bootstrap}",
            f"--topic={topic}",
            f"--group={group}",
            f"--concurrency={plan.concurrency}",
            f"--max-sleep-ms={plan.max_sleep_ms}",
            f"--commit-interval={plan.commit_interval}",
            f"--session-timeout-ms={plan.session_timeout_ms}",
        ]
        self._folder = folder
        self.members: list[Member] = []

    def start(self) -> Member:
        run = len(self.members)
        log = self._folder / f"run-{run}.log"
        with open(self._folder / f"run-{run}.stderr", "wb") as stderr:
            process = subprocess.Popen(
                [*self._args, f"--log={log}"],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,  # a Ctrl-C in the terminal is the test's to handle
            )
        member = Member(run, log, process)
        self.members.append(member)
        return member

    def alive(self) -> list[Member]:
        return [m for m in self.members if m.killed_at is None and m.process.poll() is None]

    def failed(self) -> list[Member]:
        """Members that exited by themselves with an error."""
        return [
            m
            for m in self.members
            if m.killed_at is None and m.process.poll() is not None and m.process.returncode != 0
        ]

    def kill(self, member: Member) -> None:
        member.process.send_signal(signal.SIGKILL)
        member.process.wait()
        member.killed_at = time.monotonic()

    def stop_all(self) -> None:
        """Kill every process still running and reap them all."""
        for member in self.members:
            if member.process.poll() is None:
                member.process.kill()
        for member in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.process.wait(10)


class Progress:
    """Reads the workers' logs as they grow: records handled, members started and joined."""

    def __init__(self) -> None:
        self._positions: dict[Path, int] = {}
        self.handled: set[tuple[int, int]] = set()

    def update(self, members: list[Member]) -> None:
        for member in members:
            if not member.log.exists():
                continue
            position = self._positions.get(member.log, 0)
            with open(member.log, "rb") as f:
                f.seek(position)
                data = f.read()
            end = data.rfind(b"\n") + 1  # whole lines only; the rest is read next time
            self._positions[member.log] = position + end
            for line in data[:end].splitlines():
                kind = line[:2]
                if kind == b"H ":
                    _, _, partition, offset, *_ = line.split()
                    self.handled.add((int(partition), int(offset)))
                elif kind == b"S ":
                    member.started = True
                elif kind == b"A ":
                    member.joined = True


def _wait(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    show: Callable[[], object] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            detail = f" ({show()})" if show is not None else ""
            raise ChaosError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(POLL_STEP)


def run_chaos(bootstrap: str, topic: str, group: str, plan: ChaosPlan, folder: Path) -> ChaosReport:
    """Run ``plan`` against ``topic`` (which must have ``plan.partitions`` partitions)."""
    rng = random.Random(plan.seed)
    keys = [f"k{i}" for i in range(plan.keys)]
    produced = produce_records(
        bootstrap, topic, plan.records, keys=keys, partitions=list(range(plan.partitions))
    )
    expected = {(r.partition, r.offset) for r in produced}
    report = ChaosReport(plan=plan, folder=folder, records=len(produced))
    members = Group(bootstrap, topic, group, plan, folder)
    progress = Progress()

    def check() -> None:
        failed = members.failed()
        if failed:
            raise ChaosError(
                f"run {failed[0].run} exited with {failed[0].process.returncode}; see {folder}"
            )
        progress.update(members.members)

    def ready_to_kill(target: int, newest: list[Member]) -> bool:
        check()
        return len(progress.handled) >= target and all(m.joined for m in newest)

    def status() -> str:
        alive = members.alive()
        return (
            f"handled {len(progress.handled)}/{len(expected)}; alive runs "
            f"{[m.run for m in alive]}, joined {[m.run for m in alive if m.joined]}"
        )

    # The records are cut into kills + 2 slices: kill k waits until k + 1 slices are handled.
    slice_size = len(expected) // (plan.kills + 2)
    started = time.monotonic()
    try:
        newest = [members.start() for _ in range(plan.members)]
        last = time.monotonic()
        for k in range(plan.kills):
            target = slice_size * (k + 1)
            in_rebalance = k > 0 and rng.random() < plan.kills_in_rebalance
            if in_rebalance:  # only kill_interval after the previous kill: still rebalancing
                target, newest = 0, []
            _wait(
                functools.partial(ready_to_kill, target, newest),
                plan.phase_timeout,
                f"the group to recover and handle {target} records before kill {k + 1}",
                status,
            )
            pause = last + plan.kill_interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the schedule: at least kill_interval between kills
            victim = rng.choice(members.alive())
            members.kill(victim)
            newest = [members.start()]
            last = time.monotonic()
            report.kills.append(
                Kill(victim.run, last - started, len(progress.handled), in_rebalance)
            )

        def everything_handled() -> bool:
            check()
            return len(progress.handled) >= len(expected)

        def ready_for_sigterm(survivors: list[Member]) -> bool:
            check()
            return all(m.started for m in survivors)

        _wait(everything_handled, plan.phase_timeout, "every record handled", status)
        survivors = members.alive()
        _wait(
            functools.partial(ready_for_sigterm, survivors),
            plan.phase_timeout,
            "every survivor to be ready for SIGTERM",
            status,
        )
        for member in survivors:
            member.process.send_signal(signal.SIGTERM)
        _wait(
            lambda: all(m.process.poll() is not None for m in survivors),
            plan.phase_timeout,
            "the survivors to close",
            lambda: [m.run for m in survivors if m.process.poll() is None],
        )
        failed = [(m.run, m.process.returncode) for m in survivors if m.process.returncode != 0]
        if failed:
            raise ChaosError(f"survivors exited with errors (run, code): {failed}; see {folder}")
    finally:
        members.stop_all()
    report.seconds = time.monotonic() - started
    report.runs = len(members.members)
    report.committed, report.ends = _committed_and_ends(bootstrap, topic, group, plan.partitions)
    _analyse(report, members.members, expected)
    return report


def _committed_and_ends(
    bootstrap: str, topic: str, group: str, partitions: int
) -> tuple[dict[int, int], dict[int, int]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=15)}
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=15)[1] for tp in tps}
    finally:
        consumer.close()
    return committed, ends


def _lines(path: Path) -> Iterator[list[str]]:
    if not path.exists():
        return
    for raw in path.read_bytes().splitlines():
        fields = raw.decode(errors="replace").split()
        if fields:
            yield fields


def _offsets(fields: list[str]) -> Iterator[tuple[int, int]]:
    """``<partition>=<offset>`` fields as numbers."""
    for pair in fields:
        partition, _, offset = pair.partition("=")
        yield int(partition), int(offset)


def _partition_list(field: str) -> list[int]:
    return [int(p) for p in field.split(",") if p != "-"]


def _commits_ahead(
    commits_seen: list[tuple[int, int, int, int]],
    first_handled: dict[tuple[int, int], int],
    expected: set[tuple[int, int]],
) -> list[str]:
    """Committed offsets some process saw before every record below them was handled.

    Monotonic clock readings are comparable between processes on one machine, and a record's
    line is written before its handler returns, so before any commit that counts it.
    """
    never = 1 << 62
    # per partition: latest[p][c] = the latest first-handled time of the records below offset c
    latest: dict[int, list[int]] = {}
    for p in {p for p, _ in expected}:
        times = [0]
        for o in range(max(o for q, o in expected if q == p) + 1):
            handled_at = first_handled.get((p, o), never) if (p, o) in expected else 0
            times.append(max(times[-1], handled_at))
        latest[p] = times
    ahead = []
    for run, ns, p, offset in commits_seen:
        if offset <= 0:
            continue  # nothing committed yet (-1001 reads as "no offset")
        times = latest.get(p, [0])
        if times[min(offset, len(times) - 1)] > ns:
            ahead.append(f"run {run} saw partition {p} committed at {offset} before all below ran")
    return ahead


def _analyse(report: ChaosReport, members: list[Member], expected: set[tuple[int, int]]) -> None:
    calls: Counter[tuple[int, int]] = Counter()
    first_handled: dict[tuple[int, int], int] = {}  # (partition, offset) -> earliest H time
    commits_seen: list[tuple[int, int, int, int]] = []  # (run, time, partition, offset)
    final_commit_ok = report.committed == report.ends
    for member in members:
        owned: set[int] = set()
        # per owned partition: offsets handled in this ownership and not yet seen committed
        pending: dict[int, list[int]] = defaultdict(list)
        at_risk = 0
        stale = 0
        last_first: dict[tuple[int, str], int] = {}  # (partition, key) -> highest first call
        seen: set[tuple[int, int]] = set()
        for fields in _lines(member.log):
            kind = fields[0]
            if kind == "H" and len(fields) == 6:
                partition, offset, key = int(fields[2]), int(fields[3]), fields[4]
                calls[(partition, offset)] += 1
                ns = int(fields[1])
                if ns < first_handled.get((partition, offset), ns + 1):
                    first_handled[(partition, offset)] = ns
                report.retried_calls += int(fields[5]) > 0
                if partition in owned:
                    pending[partition].append(offset)
                else:
                    at_risk += 1  # finished after its partition was revoked: a stale result
                if (partition, offset) in seen:
                    report.duplicates_within_a_process += 1
                    continue
                seen.add((partition, offset))
                lane = (partition, key)
                if offset < last_first.get(lane, -1):
                    report.order_violations.append(
                        f"run {member.run}: partition {partition} key {key}: offset {offset} "
                        f"first handled after offset {last_first[lane]}"
                    )
                last_first[lane] = max(offset, last_first.get(lane, -1))
            elif kind == "A":
                owned.update(_partition_list(fields[2]))
            elif kind == "R":
                closing = fields[3:] == ["closing"]
                committed = {} if closing else dict(_offsets(fields[3:]))
                commits_seen.extend(
                    (member.run, int(fields[1]), p, o) for p, o in committed.items()
                )
                for p in _partition_list(fields[2]):
                    owned.discard(p)
                    left = pending.pop(p, [])
                    if closing and final_commit_ok and member.killed_at is None:
                        continue  # the final commit covers them: checked as committed == end
                    floor = committed.get(p, -1)
                    at_risk += sum(o >= floor for o in left)
            elif kind == "C":
                stale = int(fields[2])
                for p, committed_offset in _offsets(fields[3:]):
                    commits_seen.append((member.run, int(fields[1]), p, committed_offset))
                    if pending.get(p):
                        pending[p] = [o for o in pending[p] if o >= committed_offset]
            elif kind == "F":
                stale = int(fields[2])
                report.chains += int(fields[5])
            elif kind == "W":
                report.worker_warnings.append(f"run {member.run}: {' '.join(fields[2:])}")
            elif kind == "X":
                report.worker_errors.append(f"run {member.run}: {' '.join(fields[2:])}")
        stderr = member.log.with_suffix(".stderr")
        if stderr.exists():
            report.worker_stderr_lines += len(stderr.read_bytes().splitlines())
        at_risk += sum(len(offsets) for offsets in pending.values())
        if member.killed_at is None:
            report.at_risk_survivors += at_risk
        else:
            report.at_risk_killed += at_risk
            for kill in report.kills:
                if kill.run == member.run:
                    kill.at_risk = at_risk
        report.stale += stale
    report.commits_ahead = _commits_ahead(commits_seen, first_handled, expected)
    handled = set(calls)
    report.lost = len(expected - handled)
    report.unexpected = len(handled - expected)
    report.calls = sum(calls.values())
    report.duplicates = report.calls - len(handled)


def check(report: ChaosReport) -> None:
    """Assert what the chaos test promises; the summary is in every failure message."""
    summary = report.summary()
    assert len(report.kills) == report.plan.kills, summary
    assert report.worker_errors == [], summary
    assert report.lost == 0, summary
    assert report.unexpected == 0, summary
    assert report.committed == report.ends, summary
    assert report.order_violations == [], f"{report.order_violations[:10]}\n{summary}"
    assert report.commits_ahead == [], f"{report.commits_ahead[:10]}\n{summary}"
    assert report.retried_calls == 0, summary  # the handler never fails
    assert report.duplicates <= report.bound, summary
