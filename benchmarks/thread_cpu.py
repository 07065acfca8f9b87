"""CPU use of every thread of a command's process tree over a window mid-run (Linux /proc).

    python benchmarks/thread_cpu.py --after 20 --window 8 -- python -m refddp.train --nproc 2 ...

Issue 47 asked whether a refddp rank runs a thread the plain loop does not (a watchdog, a
watch on the parent, a tracker's writer) that takes CPU from the training thread when the
ranks fill every core. It samples each thread's user + system time at ``--after`` seconds and
again ``--window`` seconds later and prints its share of one core, with OMP_NUM_THREADS=1 as
benchmarks/trainer_overhead.py runs every runner; a thread or process that started within the
window counts from 0 and is marked "(new)". Threads at 0.0% are left out unless --all. It
prints when the command has ended (its output is discarded).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue  # ended meanwhile
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [child for child, parent in parents.items() if parent == pid]
    return found


def thread_times(root: int) -> dict[tuple[int, int], tuple[str, str, float]]:
    """(pid, tid) -> (command line, thread name, CPU seconds so far) for the tree's threads."""
    times = {}
    for pid in process_tree(root):
        try:
            command = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                times[(pid, int(tid))] = (command, name, (int(fields[11]) + int(fields[12])) / TICKS)
        except OSError:
            continue
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--after", type=float, default=10.0, help="seconds before the first sample")
    parser.add_argument("--window", type=float, default=5.0, help="seconds between the samples")
    parser.add_argument("--all", action="store_true", help="also threads that used no CPU")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    proc = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(args.after)
        before = thread_times(proc.pid)
        time.sleep(args.window)
        after = thread_times(proc.pid)
        if proc.poll() is not None or not after:
            raise SystemExit(f"the command ended before the window did (exit {proc.returncode})")
    finally:
        proc.wait()
    for key in sorted(after):
        command_line, name, seconds = after[key]
        share = (seconds - before[key][2] if key in before else seconds) / args.window
        if share > 0 or args.all:
            new = "" if key in before else " (new)"
            print(f"{key[0]:>7} {key[1]:>7} {name:<16} {share:6.1%}{new}  {command_line[:70]}")


if __name__ == "__main__":
    main()
