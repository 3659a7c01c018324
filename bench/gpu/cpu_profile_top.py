#!/usr/bin/env python3
"""Where a worker's CPU time went: gperftools CPU profiles (overhead.py
--cpu-profile-steps) as tables of milliseconds per step, by function and by
library, each mode against the first profile given (native).

  cpu_profile_top.py --steps N native.prof transparent.prof ...

Run it where the profiles were taken: it names each sampled address from
the libraries that process had mapped (the profile ends with its
/proc/self/maps), with `nm` (binutils). An address outside every symbol nm
lists (a stripped library's internal function) is named by its library and
the symbol listed before it ("unlisted, after X"), never as X itself.

Profile format (gperftools' legacy CPU profile, 64-bit words): a header
[0, 3, 0, period_us, 0], samples [count, depth, pc x depth] (the first pc is
where the signal landed, the others return addresses), a trailer [0, 1, 0],
then the process's maps as text.
"""

import argparse
import bisect
import collections
import os
import re
import struct
import subprocess
import sys

WORD = struct.Struct("<Q")


def read_profile(path):
    """(period_us, [(count, [pc, ...])], [(start, end, offset, path)])."""
    with open(path, "rb") as f:
        data = f.read()
    words = len(data) // 8

    def word(i):
        return WORD.unpack_from(data, 8 * i)[0]

    if words < 5 or word(0) != 0 or word(1) != 3:
        raise ValueError(f"{path}: not a gperftools CPU profile")
    period_us = word(3)
    samples, i = [], 5
    while i + 1 < words:
        count, depth = word(i), word(i + 1)
        if count == 0 and depth == 1:  # the trailer [0, 1, 0]
            i += 3
            break
        samples.append((count, [word(i + 2 + k) for k in range(depth)]))
        i += 2 + depth
    maps = []
    for line in data[8 * i:].decode(errors="replace").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        maps.append((start, end, int(parts[2], 16), parts[5].strip()))
    maps.sort()
    return period_us, samples, maps


def load_segments(path):
    """The ELF file's PT_LOAD segments as (file offset, file size, vaddr)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return []
        phoff, = struct.unpack_from("<Q", head, 0x20)
        entsize, count = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(entsize * count)
    segments = []
    for k in range(count):
        p_type, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, k * entsize)
        if p_type == 1:  # PT_LOAD
            segments.append((offset, filesz, vaddr))
    return segments


class Symbols:
    """One library's functions, from its symbol table or else its dynamic one."""

    def __init__(self, path):
        self.name = os.path.basename(path)
        self.segments = load_segments(path)
        entries = []
        for dynamic in ([], ["-D"]):
            try:
                out = subprocess.run(["nm", "-C", "-S", "--defined-only"] + dynamic + [path],
                                     capture_output=True, text=True, check=False).stdout
            except FileNotFoundError:
                sys.exit("cpu_profile_top.py needs nm (binutils)")
            for line in out.splitlines():
                parts = line.split(None, 3)
                if len(parts) == 4 and parts[2] in "tTwWiI":
                    entries.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
            if entries:
                break
        entries.sort()
        self.starts = [e[0] for e in entries]
        self.entries = entries

    def name_of(self, file_offset):
        vaddr = None
        for offset, size, base in self.segments:
            if offset <= file_offset < offset + size:
                vaddr = file_offset - offset + base
                break
        if vaddr is not None:
            k = bisect.bisect_right(self.starts, vaddr) - 1
            if k >= 0:
                start, size, name = self.entries[k]
                if start <= vaddr < start + max(size, 1):
                    return name
                # A function nm does not list (stripped, file-local), named by
                # the listed one before it: the samples of one such function
                # add up together, and the name does not claim to be its own.
                return f"(unlisted, after {name})"
        return "(unlisted)"


class Namer:
    def __init__(self):
        self.libraries = {}
        self.cache = {}

    def frame(self, maps, pc, leaf):
        key = (pc, leaf, id(maps))
        if key not in self.cache:
            address = pc if leaf else pc - 1  # a return address is past its call
            k = bisect.bisect_right(maps, (address, float("inf"))) - 1
            if k < 0 or not maps[k][0] <= address < maps[k][1]:
                named = ("?", f"{address:#x}")
            else:
                start, _, offset, path = maps[k]
                if path not in self.libraries:
                    self.libraries[path] = Symbols(path) if os.path.exists(path) else None
                symbols = self.libraries[path]
                library = os.path.basename(path)
                file_offset = address - start + offset
                named = (library, symbols.name_of(file_offset) if symbols
                         else f"{library}+{file_offset:#x}")
            self.cache[key] = named
        return self.cache[key]


def label(key):
    """A row's name: a frame, (library, function), as "function [library]"."""
    return "{1} [{0}]".format(*key) if isinstance(key, tuple) else key


def tally(path, steps, namer, callers=None):
    """ms per step by leaf frame, by leaf library, and by frame on the stack
    (each counted once a sample), frames as (library, function); with
    `callers` (a regular expression), by what the innermost frame it
    matches called."""
    period_us, samples, maps = read_profile(path)
    per_sample_ms = period_us / 1000.0 / steps
    leaf, library, inclusive, callees = (collections.Counter() for _ in range(4))
    total = 0
    for count, pcs in samples:
        total += count
        frames = [namer.frame(maps, pc, k == 0) for k, pc in enumerate(pcs)]
        if not frames:
            continue
        ms = count * per_sample_ms
        leaf[frames[0]] += ms
        library[frames[0][0]] += ms
        for frame in set(frames):
            inclusive[frame] += ms
        if callers is not None:
            for k, (lib, fn) in enumerate(frames):
                if callers.search(fn):
                    callee = "(itself)" if k == 0 else label(frames[k - 1])
                    callees[f"{fn}  ->  {callee}"] += ms
                    break
    return {"total": total * per_sample_ms, "leaf": leaf, "library": library,
            "inclusive": inclusive, "callees": callees}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, required=True, help="the steps each profile covers")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--callers", type=re.compile, default=None,
                   help="also: what the functions this regular expression matches called, "
                        "by callee (the innermost match on each stack)")
    p.add_argument("--library", default=None,
                   help="also: the functions of the libraries whose name contains this")
    p.add_argument("profiles", nargs="+", help="the first is the base (native)")
    a = p.parse_args()
    namer = Namer()
    names = [os.path.basename(x).rsplit(".", 1)[0] for x in a.profiles]
    tallies = [tally(x, a.steps, namer, a.callers) for x in a.profiles]
    if a.library:
        for t in tallies:
            for kind in ("leaf", "inclusive"):
                t[f"{kind} in {a.library}"] = collections.Counter(
                    {frame: v for frame, v in t[kind].items() if a.library in frame[0]})
    base = tallies[0]
    print("CPU time per step over every thread (ms), from the samples: "
          + ", ".join(f"{n} {t['total']:.2f}" for n, t in zip(names, tallies)))
    kinds = [("library", "library, where the samples landed"),
             ("leaf", "function, where the samples landed (self time)"),
             ("inclusive", "function anywhere on the stack (inclusive time)")]
    if a.library:
        kinds += [(f"leaf in {a.library}", f"function of {a.library}* (self time)"),
                  (f"inclusive in {a.library}", f"function of {a.library}* (inclusive time)")]
    if a.callers:
        kinds.append(("callees", f"callee of /{a.callers.pattern}/ (its inclusive time)"))
    for kind, what in kinds:
        for name, t in zip(names, tallies):
            rows = t[kind].most_common(a.top) if t is base else sorted(
                ((k, v - base[kind].get(k, 0.0)) for k, v in t[kind].items()),
                key=lambda kv: -kv[1])[:a.top]
            heading = "most" if t is base else f"most above {names[0]}'s"
            print(f"\n{name}: by {what}, {heading} (ms/step)\n")
            for k, v in rows:
                print(f"  {v:9.3f}  {label(k)}")


if __name__ == "__main__":
    main()
