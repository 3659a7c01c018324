#!/usr/bin/env python3
"""Static checks of deploy/docker/Dockerfile (no Docker daemon needed): a
Debian 12 builder that runs scripts/install-deps and the release preset; a
debian:12-slim runtime (the last stage, through the stages it is built on)
with the two binaries from the builder, a non-root USER, a HEALTHCHECK
through `allocctl health`; the runtime-prebuilt target the same image with
the binaries of a build tree (the build context allocd-prebuilt); and its
apt package list covers every shared library that the built binaries load
(ldd + dpkg -S on this Debian 12 machine, which builds like the image's
builder). tests/deploy/image_test.sh builds and runs the image.

    dockerfile_test.py [ALLOCD_BINARY ALLOCCTL_BINARY]
"""
import os
import re
import shutil
import subprocess
import sys

import deploylib as d

# In debian:12-slim already (essential packages or apt's own dependencies).
BASE_IMAGE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libssl3"}


def instructions(text):
    """(INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages_of(ins):
    """{stage name: its instructions, FROM first}, in the Dockerfile's order
    (an unnamed stage is named by its index)."""
    stages = {}
    for word, args in ins:
        if word == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", args, re.I)
            current = m.group(1) if m else str(len(stages))
            stages[current] = []
        if stages:
            stages[current].append((word, args))
    return stages


def chain(stages, name):
    """The stages `name` is built on, its base first, ending with `name`."""
    names = [name]
    while True:
        base = stages[names[0]][0][1].split()[0]
        if base not in stages or base in names:
            return names
        names.insert(0, base)


def candidate_paths(lib):
    candidates = [lib, os.path.realpath(lib)]
    for path in list(candidates):  # usrmerge: /usr/lib/... is /lib/... in dpkg's db
        if path.startswith("/usr/lib/"):
            candidates.append(path[len("/usr"):])
        elif path.startswith("/lib/"):
            candidates.append("/usr" + path)
    return candidates


def owning_packages(libs):
    """{lib: package or None}, from one dpkg -S call (each call reads the
    whole package database: one per library took most of a minute)."""
    candidates = {lib: candidate_paths(lib) for lib in libs}
    paths = sorted({p for c in candidates.values() for p in c})
    proc = subprocess.run(["dpkg", "-S", *paths], capture_output=True, text=True)
    owner = {}
    for line in proc.stdout.splitlines():
        package, _, path = line.partition(": ")
        owner.setdefault(path.strip(), package.split(",")[0].strip())
    return {lib: next((owner[p] for p in c if p in owner), None)
            for lib, c in candidates.items()}


def main():
    dockerfile = d.DEPLOY / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    ins = instructions(text)
    froms = [args for word, args in ins if word == "FROM"]
    if len(froms) < 2:
        d.fail("not a multi-stage build")
    if not re.match(r"debian:12(\s|$)", froms[0]) or " AS builder" not in froms[0]:
        d.fail(f"builder stage should be 'FROM debian:12 AS builder', is {froms[0]!r}")
    stages = stages_of(ins)
    final = list(stages)[-1]
    runtime = chain(stages, final)
    if not stages[runtime[0]][0][1].startswith("debian:12-slim"):
        d.fail(f"runtime stage {final} is not built on debian:12-slim but on "
               f"{stages[runtime[0]][0][1]!r}")
    builder = stages["builder"]
    runtime = [i for name in runtime for i in stages[name]]
    builder_runs = " ".join(a for w, a in builder if w == "RUN")
    for needle in ("scripts/install-deps", "cmake --preset release",
                   "cmake --build --preset release"):
        if needle not in builder_runs:
            d.fail(f"builder does not run {needle!r}")

    copies = [a for w, a in runtime if w == "COPY"]
    if not any("--from=builder" in c and "allocd" in c and "allocctl" in c for c in copies):
        d.fail("runtime stage does not copy allocd and allocctl from the builder")
    if any("--from" not in c for c in copies):
        d.fail(f"runtime stage copies from the context: {copies}")
    prebuilt = stages.get("runtime-prebuilt")
    if prebuilt is None or chain(stages, "runtime-prebuilt")[:-1] != chain(stages, final)[:-1]:
        d.fail("no stage runtime-prebuilt built on the same stages as the runtime")
    prebuilt_copies = [a for w, a in prebuilt if w == "COPY"]
    if prebuilt_copies != ["--from=allocd-prebuilt bin/allocd bin/allocctl /usr/bin/"]:
        d.fail(f"runtime-prebuilt should copy bin/allocd and bin/allocctl from the build "
               f"context allocd-prebuilt and nothing else: {prebuilt_copies}")
    users = [a for w, a in runtime if w == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        d.fail(f"runtime stage does not switch to a non-root USER ({users})")
    health = [a for w, a in runtime if w == "HEALTHCHECK"]
    if not health or "allocctl" not in health[-1] or "health" not in health[-1].split("CMD", 1)[-1]:
        d.fail(f"no HEALTHCHECK through `allocctl ... health` ({health})")
    entry = [a for w, a in runtime if w == "ENTRYPOINT"]
    if not entry or "allocd" not in entry[-1]:
        d.fail("ENTRYPOINT is not allocd")

    runtime_runs = " ".join(a for w, a in runtime if w == "RUN")
    m = re.search(r"apt-get install ([^&;]*)", runtime_runs)
    if not m:
        d.fail("runtime stage installs no packages")
    packages = {p for p in m.group(1).split() if not p.startswith("-")}
    if any("-dev" in p for p in packages):
        d.fail(f"runtime stage installs -dev packages: {sorted(packages)}")

    ignore = d.DEPLOY / "docker" / "Dockerfile.dockerignore"
    if not ignore.exists() or not re.search(r"^/?build/?$", ignore.read_text(), re.M):
        d.fail("Dockerfile.dockerignore must keep build/ out of the context")

    checked = "static"
    binaries = sys.argv[1:]
    if binaries and shutil.which("ldd") and shutil.which("dpkg"):
        loaded = {}
        for binary in binaries:
            proc = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True)
            for lib in re.findall(r"=>\s*(/\S+)", proc.stdout):
                loaded.setdefault(lib, binary)
        needed = {}
        for lib, pkg in owning_packages(loaded).items():
            if pkg is None:
                d.fail(f"{loaded[lib]} loads {lib}, which no Debian package owns: the "
                       f"runtime image would not have it")
            needed.setdefault(pkg.split(":")[0], lib)
        missing = {p: lib for p, lib in needed.items()
                   if p not in packages and p not in BASE_IMAGE_PACKAGES}
        if missing:
            d.fail("the runtime stage lacks packages the binaries load: " +
                   ", ".join(f"{p} ({lib})" for p, lib in sorted(missing.items())))
        checked = (f"static, and its {len(packages)} runtime packages cover the "
                   f"{len(needed)} packages whose libraries allocd and allocctl load")
    d.log(f"Dockerfile: {len(froms)} stages ({' / '.join(froms)}); runtime {' -> '.join(chain(stages, final))}; USER {users[-1]}; "
          f"{checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
