"""A pool's per-rank files and the failure reports built from them.

Each rank of a pool writes, in the pool's work directory: its stdout and stderr
(``rank<N>.out``), its faulthandler stack dumps (``rank<N>.stack``) and the last collective it
entered (``rank<N>.collective``, see ``collectives.py``). The driver reads them to echo a
task's output and to explain a failure or a hang.
"""

from __future__ import annotations

import os
import re
import time

from refddp.testing.protocol import FAILURES, STACK_SIGNAL, Died, Failed, Reply
from refddp.testing.rank_lists import group, group_rank_lines, rank_list, who
from refddp.testing.slots import SlotReading, read_slot, slot_path_for

OUTPUT_TAIL_LINES = 40
SHOWN_IN_FULL = 16  # ranks: up to this world size every traceback, stack and output is shown
STACK_WAIT_S = 5.0  # for every rank's dump: generous, on a machine loaded by a compile
FULL_SECTIONS = 6  # beyond it, distinct tracebacks, stacks or outputs in full; the rest one line
_THREAD_ID = re.compile(r"0x[0-9a-f]{8,}")
_PEER_PORT = re.compile(r"(\[[0-9a-fA-F.:]+\]):\d+")  # gloo's "[127.0.0.1]:5528"


class PoolFiles:
    """The files of one pool's ranks, and the reports made from them."""

    def __init__(self, workdir: str, world_size: int, backend: str):
        self.workdir, self.world_size, self.backend = workdir, world_size, backend

    def out_path(self, rank: int) -> str:
        return os.path.join(self.workdir, f"rank{rank}.out")

    def out_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.out_path(rank))
        except OSError:
            return 0

    def output(self, rank: int, offset: int) -> str:
        try:
            with open(self.out_path(rank), "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def echo_output(self, offsets: list[int]) -> None:
        for rank, offset in enumerate(offsets):
            for line in self.output(rank, offset).splitlines():
                print(f"[rank {rank}] {line}")

    def dump_stacks(self, pids: dict[int, int]) -> dict[int, str]:
        """Every thread's Python stack of each listed (still running) rank -> pid, through the
        faulthandler each rank arms for ``STACK_SIGNAL``, with the last collective it entered.
        A rank that writes none within ``STACK_WAIT_S`` gets one line saying why instead."""
        ranks = list(pids)
        if not ranks:
            return {}
        paths = {r: os.path.join(self.workdir, f"rank{r}.stack") for r in ranks}
        before = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
        for r in ranks:
            try:
                os.kill(pids[r], STACK_SIGNAL)
            except ProcessLookupError:
                pass
        deadline, last = time.monotonic() + STACK_WAIT_S, None
        while time.monotonic() < deadline:  # until every dump has stopped growing
            time.sleep(0.05)
            sizes = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
            if sizes == last and all(sizes[r] > before[r] for r in ranks):
                break
            last = sizes
        stacks = {}
        for r, p in paths.items():
            with open(p, "rb") as f:
                f.seek(before[r])
                text = f.read().decode(errors="replace").strip()
            text = text or f"(no stack: {why_no_stack(pids[r])})"
            last_collective = read_slot(slot_path_for(self.workdir, r)).last or "none"
            stacks[r] = f"last collective entered: {last_collective}\nstack (all threads):\n{text}"
        return stacks

    def report(
        self,
        headline: str,
        failures: dict[int, str],
        stacks: dict[int, str],
        offsets: list[int] | None = None,
        details: list[str] = (),  # type: ignore[assignment]
    ) -> str:
        """The headline, the details, then each rank's state and output, failed ranks first.

        Ranks that say the same thing share one header (thread ids and peers' ports aside,
        which differ between processes doing the same). Up to ``SHOWN_IN_FULL`` ranks every
        traceback, stack and output is shown; in larger pools the first ``FULL_SECTIONS``
        distinct ones (failures before stacks), and each other in one line, so that a thousand
        ranks make a screenful.
        """
        lines = [f"{headline} (world_size={self.world_size}, backend={self.backend})"]
        lines += ["    " + d for d in group_rank_lines(map(_same_for_every_process, details))]
        failed = group((r, _same_for_every_process(failures[r])) for r in sorted(failures))
        running = group((r, _same_for_every_process(stacks[r])) for r in sorted(stacks))
        finished = [r for r in range(self.world_size) if r not in failures and r not in stacks]
        room = len(failed) + len(running) if self.world_size <= SHOWN_IN_FULL else FULL_SECTIONS
        sections = [(ranks, "failed:", text) for ranks, text in failed]
        sections += [(ranks, "was still running:" if len(ranks) == 1 else
                      "were still running:", text) for ranks, text in running]  # fmt: skip
        for shown, (ranks, state, text) in enumerate(sections):
            if shown < room:
                lines.append(f"--- {who(ranks)} {state}")
                lines += ["    " + ln for ln in text.rstrip().splitlines()]
            else:  # a traceback's exception; a stack's last collective
                gist = exception_line(text) if state == "failed:" else text
                lines.append(f"--- {who(ranks)} {state} {gist.splitlines()[0]}")
        if finished:
            lines.append(f"--- {who(finished)} finished")
        order = sorted(range(self.world_size), key=lambda r: r not in failures)
        outputs = group((r, self.output(r, offsets[r] if offsets else 0)) for r in order)
        outputs = [(ranks, out) for ranks, out in outputs if out.strip()]
        room = len(outputs) if self.world_size <= SHOWN_IN_FULL else FULL_SECTIONS
        for ranks, out in outputs[:room]:
            tag = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"
            lines.append(f"--- {who(ranks)} output (last {OUTPUT_TAIL_LINES} lines):")
            lines += [f"[{tag}] {ln}" for ln in out.splitlines()[-OUTPUT_TAIL_LINES:]]
        rest = [r for ranks, _ in outputs[room:] for r in ranks]
        if rest:
            lines.append(f"--- output of {who(sorted(rest))} not shown: "
                         f"{len(outputs) - room} more distinct output(s)")  # fmt: skip
        return "\n".join(lines)


def why_no_stack(pid: int) -> str:
    """Why the rank ``pid`` wrote no stack when asked, in one line, from what the kernel says
    of it (``/proc``): stopped, exited, ignoring or blocking the signal, its handler replaced,
    or none of these (then it was slow to answer)."""
    signum = int(STACK_SIGNAL)
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        masks = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                masks += [ln.split()[1] for ln in f if ln.startswith("SigBlk:")]
    except (OSError, IndexError, ValueError):
        return "it exited before it could answer"

    def has(mask: str) -> bool:
        return bool(int(mask, 16) >> (signum - 1) & 1)

    if state in ("T", "t"):
        return f"it is stopped (state {state}: SIGSTOP or a debugger) and cannot run its dump"
    if state in ("Z", "X"):
        return "it exited before it could answer"
    if has(status.get("SigIgn", "0")):
        return f"it ignores signal {signum}, the harness's stack request (set by the test's code)"
    if masks and all(has(m) for m in masks):
        return f"every thread of it blocks signal {signum}, the harness's stack request"
    if not has(status.get("SigCgt", "0")):
        return f"its handler for signal {signum} (the harness's stack request) was removed"
    if state == "D":
        return "it is in uninterruptible sleep in the kernel (a disk or a mount not answering)"
    return (f"it did not answer within {STACK_WAIT_S:.0f} s (state {state}, load average "
            f"{os.getloadavg()[0]:.1f}): a handler of the test's own for signal {signum} took "
            "the request, or the machine is too loaded")


def _same_for_every_process(text: str) -> str:
    """A stack, traceback or line without what differs between processes doing the same
    thing (thread ids, the port of a peer's connection), so that such ranks group together."""
    return _PEER_PORT.sub(r"\1:…", _THREAD_ID.sub("0x…", text))


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


def exception_line(traceback_text: str) -> str:
    """``ExcType: the message's first line`` from a formatted traceback: what failed, not the
    last line of a long message (PyTorch's assertions end with a hint on reproducing them)."""
    lines = traceback_text.rstrip().splitlines()
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')]
    if not frames:
        return _last_line(traceback_text)
    start = frames[-1] + 1
    while start < len(lines) and lines[start].startswith("    "):  # the frame's source, carets
        start += 1
    message = [ln.strip() for ln in lines[start:] if ln.strip()]
    return message[0] if message else _last_line(traceback_text)


def _inside(reply: Reply, slot: SlotReading) -> str:
    """The collective a failed rank was in when it failed ("" if none)."""
    if isinstance(reply, Failed):
        return reply.in_collective
    if isinstance(reply, Died) and slot.inside:
        return slot.last
    return ""


def find_cause(
    replies: dict[int, Reply], fired: dict[int, list[str]], slots: dict[int, SlotReading]
) -> int | None:
    """The rank that failed first, the others' failures following from it; None if no one rank
    is to blame (every failed rank failed inside a collective: ranks that disagreed on one).

    An injected fault that fired is the cause; else a rank that failed outside any collective
    (raised, exited, was killed): the earliest. A rank failing inside a collective is usually
    a victim, its peer gone.
    """
    failed = {r: m for r, m in replies.items() if isinstance(m, FAILURES)}
    by_fault = [r for r in failed if r in fired]
    outside = [r for r in failed if not _inside(failed[r], slots[r])]
    candidates = by_fault or outside
    if not candidates:
        return None
    return min(candidates, key=lambda r: (getattr(failed[r], "at", 0.0), r))


def blocked_for_good(pending: list[int], slots: dict[int, SlotReading], world_size: int
                     ) -> list[int]:  # fmt: skip
    """The pending ranks that wait in a collective no running rank can ever help complete.

    A pending rank can still progress if it is in no collective, or if its collective's
    members are unknown (a group built from a backend class), or if one of those members is
    itself able to progress: a member still on its way (a rooted ``gather`` whose root waits
    for a late member is no hang), or one waiting in another collective that can complete.
    Whatever is left waits only on finished ranks and on one another: a certain hang. A rank
    alone in a collective, every other rank finished, is one too, members known or not.
    """
    if len(pending) == 1:
        return pending if slots[pending[0]].inside else []

    def members(rank: int) -> frozenset[int] | None:
        slot = slots[rank]
        return frozenset(range(world_size)) if slot.on_world else slot.members

    live = {r for r in pending if not slots[r].inside or members(r) is None}
    grew = True
    while grew:  # members that can progress let the ranks waiting on them progress too
        grew = False
        for rank in pending:
            if rank not in live and any(m in live for m in members(rank) - {rank}):
                live.add(rank)
                grew = True
    return [r for r in pending if r not in live]


def finished_without_joining(
    waiting: list[int], finished: set[int], slots: dict[int, SlotReading]
) -> list[int]:
    """The finished ranks that the collectives the ``waiting`` ranks are in (or failed in) need:
    the ranks that skipped them.

    A finished rank outside a subgroup is not one (where a collective's members are unknown,
    every finished rank may be). Nor is one that entered as many collectives as the waiting
    rank had: it took part and got out (a broadcast's early receivers do, when no fingerprint
    check holds every rank at the door); if that leaves no one, counts were not comparable
    (subgroup collectives between) and every finished member is named.
    """
    absent: set[int] = set()
    for rank in waiting:
        slot = slots[rank]
        needed = finished if slot.on_world or slot.members is None else slot.members & finished
        short = {r for r in needed if slots[r].entered < slot.entered}
        absent |= short or needed
    return sorted(absent)


def skipped_headline(absent: list[int], waiting: list[int], slots: dict[int, SlotReading],
                     how: str) -> str:  # fmt: skip
    """ "rank(s) [2] finished without joining #3 all_reduce(...), which rank(s) [0, 1] <how>"."""
    collective = slots[waiting[0]].call
    return (f"rank(s) {rank_list(absent)} finished without joining {collective}, which rank(s) "
            f"{rank_list(waiting)} {how}")  # fmt: skip


def waiting_on_one_another_headline(waiting: list[int], slots: dict[int, SlotReading],
                                    how: str) -> str:  # fmt: skip
    """ "rank(s) [0, 2] wait for good on one another: rank 0 in #1 all_reduce(...) on group '2';
    rank 2 in ... <how>", where no finished rank is among those their calls need (each waits
    in a call that only the others can complete: two groups over the same ranks, say)."""
    calls = []
    for rank in waiting:
        slot = slots[rank]
        group = f" on group '{slot.group}'" if slot.group else ""
        calls.append(f"rank {rank} in {slot.call}{group}")
    return f"rank(s) {rank_list(waiting)} wait for good on one another: {'; '.join(calls)} {how}"


def blame(
    cause: int,
    replies: dict[int, Reply],
    pending: list[int],
    fired: dict[int, list[str]],
    slots: dict[int, SlotReading],
    why: str,
) -> tuple[str, list[str]]:
    """The headline naming the cause and how it failed, and one line per victim: the ranks then
    blocked in (or failing out of) a collective, waiting on it."""
    died = isinstance(replies.get(cause), Died) or cause not in replies
    how = why if died else exception_line(why)
    injected = "; ".join(f"injected: {line}" for line in fired.get(cause, ()))
    headline = f"rank {cause} failed first: {how}" + (f" ({injected})" if injected else "")
    victims = []
    for rank in sorted(set(replies) | set(pending)):
        if rank == cause:
            continue
        reply, slot = replies.get(rank), slots[rank]
        # A fault of its own fired too (several in one task): said, as what ended this rank
        own = "".join(f" (injected: {line})" for line in fired.get(rank, ())
                      if not line.startswith("delay "))  # (a delay ends no rank)
        if reply is None and slot.inside:
            victims.append(f"rank {rank}: waiting on rank {cause} in {slot.last}{own}")
        elif reply is None:
            last = f" (last collective: {slot.last})" if slot.last else ""
            victims.append(f"rank {rank}: still running, in no collective{last}{own}")
        elif isinstance(reply, FAILURES):
            where = _inside(reply, slot)
            text = getattr(reply, "text", None) or getattr(reply, "why", "")
            if where and not own:
                victims.append(f"rank {rank}: failed waiting on rank {cause} in {where}: "
                               f"{exception_line(text)}")  # fmt: skip
            else:
                victims.append(f"rank {rank}: also failed: {exception_line(text)}{own}")
    return headline, victims
