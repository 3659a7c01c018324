#!/usr/bin/env python3
"""The commands of the README and the docs, run as written, so that they cannot rot.

Every ```sh block and every transcript (a ``` block whose first line starts
with "$ ") in README.md and docs/*.md must say, in an HTML comment right
above it, whether this test runs it:

    <!-- readme-test: run -->             run it; it must exit 0
    <!-- readme-test: run, exit N -->     run it; it must exit N
    <!-- readme-test: skip: REASON -->    needs what a test has not (root, a GPU, a cluster)

A sh block runs as one bash script (set -euo pipefail); a transcript's "$ "
commands run one by one, and every line it shows as their output (other
than "...") must be in what they print. They run the way the README's
install step leaves a machine: allocd and allocctl from `cmake --install`
on PATH (into a temporary prefix), in a scratch directory that links the
repository's top-level entries (so traces/ is there and nothing is written
into the checkout), with a private /tmp and network when unshare(1) allows
(so fixed sockets and ports of the walkthroughs do not collide with
anything else on the machine). The checkout, the build and the scratch
directory stay reachable wherever they are, /tmp included: those the
private /tmp would hide are bound back into it. Background jobs a block
starts are ended with it. A failure names the file and the line of the
block.

The test also checks that the docs point at nothing outside the
repository: every relative link resolves to a file in it (and a heading
of it, for an #anchor).

    readme_test.py SOURCE_DIR BUILD_DIR [--scratch DIR]

--scratch: where the temporary prefix and work directory go (default:
BUILD_DIR).
"""
import argparse
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

MARKER = re.compile(r"<!--\s*readme-test:\s*(run(?:,\s*exit\s+(\d+))?|skip:[^>]*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
TIMEOUT = 300


def blocks(path):
    """(line, language, lines, marker) of each fenced block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.search(lines[k]) if k >= 0 else None
        yield start + 1, language, lines[start + 1:j], marker
        i = j + 1


def runnable(language, body):
    return language in ("sh", "bash") or (language == "" and body and body[0].startswith("$ "))


def under_tmp(paths):
    """Of `paths`, those under /tmp, relative to it, outermost first and none
    inside another: what a private /tmp would hide."""
    tmp = pathlib.Path("/tmp").resolve()
    hidden = []
    for path in sorted({pathlib.Path(p).resolve() for p in paths}):
        if path == tmp or not path.is_relative_to(tmp):
            continue
        relative = path.relative_to(tmp)
        if not any(relative.is_relative_to(outer) for outer in hidden):
            hidden.append(relative)
    return hidden


def private_tmp(keep):
    """Bash that mounts a fresh /tmp and binds `keep` (paths relative to /tmp)
    back from the old one, reached through a descriptor opened before."""
    binds = "".join(
        f'  mkdir -p /tmp/{q} && mount --no-canonicalize --bind /proc/self/fd/9/{q} /tmp/{q} ||\n'
        f'    {{ echo "readme_test: cannot bind /tmp/{q} back into the private /tmp" >&2; exit 97; }}\n'
        for q in (shlex.quote(str(k)) for k in keep))
    return ("exec 9</tmp\n"
            "mount -t tmpfs tmpfs /tmp\n"
            f"{binds}"
            "exec 9<&-\n"
            "ip link set lo up 2>/dev/null || true\n")


def isolate(keep, probe_path):
    """The command prefix and set-up that give a block a private /tmp and
    loopback, with `keep` (under /tmp) still there; (None, "") when
    unshare(1) cannot, after saying why if unshare is there."""
    if shutil.which("unshare") is None:
        return None, ""
    command = ["unshare", "--map-root-user", "--mount", "--net", "--fork", "--kill-child"]
    setup = private_tmp(keep)
    probe = subprocess.run(command + ["bash", "-c", setup + f"test -e {shlex.quote(str(probe_path))}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("readme_test: blocks run without a private /tmp and network: "
              f"{probe.stderr.strip() or 'unshare failed'}")
        return None, ""
    return command, setup


def run_script(script, workdir, env, isolation):
    """Runs bash `script`; (exit status, output). Its process group ends with it.
    `isolation`: (command prefix, set-up script) from isolate()."""
    prefix, setup = isolation
    command = (prefix or []) + ["bash", "-c", setup + script + "\n"]
    if prefix:
        env = dict(env, TMPDIR="/tmp")
    process = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        return 124, output
    finally:
        try:
            os.killpg(process.pid, 9)  # background jobs the block left
        except ProcessLookupError:
            pass
    return process.returncode, output


def anchors(path):
    """GitHub's anchors of the headings of a Markdown file."""
    result = set()
    for heading in re.findall(r"^#+\s+(.+)$", path.read_text(), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        result.add(anchor)
    return result


def check_links(source, doc, failures):
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc.resolve()
        if not str(path).startswith(str(source.resolve())) or not path.exists():
            failures.append(f"{doc.relative_to(source)}: link {target} is not a file of the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            failures.append(f"{doc.relative_to(source)}: link {target}: no such heading")
    if re.search(r"shared folder|\.\./shared/|/work/shared", text):
        failures.append(f"{doc.relative_to(source)}: points at the project's shared folder, "
                        "outside the repository")


def check_metrics(source, failures):
    """docs/metrics.md lists exactly the metrics server/metrics.cc exports."""
    code = set(re.findall(r'"(allocd_[a-z_]+)"', (source / "server" / "metrics.cc").read_text()))
    documented = set(re.findall(r"^\| `(allocd_[a-z_]+)`", (source / "docs" / "metrics.md").read_text(), re.M))
    for name in sorted(code - documented):
        failures.append(f"docs/metrics.md does not describe {name} (server/metrics.cc exports it)")
    for name in sorted(documented - code):
        failures.append(f"docs/metrics.md describes {name}, which server/metrics.cc does not export")


def main():
    parser = argparse.ArgumentParser(description="Runs the command blocks of README.md and docs/*.md.")
    parser.add_argument("source", type=pathlib.Path, help="the repository")
    parser.add_argument("build", type=pathlib.Path, help="the build to install from")
    parser.add_argument("--scratch", type=pathlib.Path,
                        help="where the temporary prefix and work directory go (default: BUILD)")
    args = parser.parse_args()
    source, build = args.source.resolve(), args.build.resolve()
    docs = [source / "README.md"] + sorted((source / "docs").glob("*.md"))
    failures, ran, skipped = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="readme_test_", dir=args.scratch or build) as tmp:
        tmp = pathlib.Path(tmp)
        prefix = tmp / "prefix"
        install = subprocess.run(["cmake", "--install", str(build), "--prefix", str(prefix)],
                                 capture_output=True, text=True)
        if install.returncode != 0:
            print(install.stdout + install.stderr)
            print("readme_test: cmake --install failed")
            return 1
        workdir = tmp / "work"
        workdir.mkdir()
        for entry in source.iterdir():
            if entry.name not in (".git", "build"):
                (workdir / entry.name).symlink_to(entry)
        env = dict(os.environ, PATH=f"{prefix / 'bin'}:{os.environ['PATH']}")
        # Each isolated block gets a fresh /tmp: what it needs from the old
        # one (a checkout, a build or this scratch directory under /tmp) is
        # bound back.
        isolation = isolate(under_tmp([source, build, tmp]), prefix / "bin" / "allocd")
        for doc in docs:
            check_links(source, doc, failures)
            for line, language, body, marker in blocks(doc):
                where = f"{doc.relative_to(source)}:{line}"
                if not runnable(language, body):
                    continue
                if marker is None:
                    failures.append(f"{where}: a command block without a "
                                    "<!-- readme-test: run|skip: why --> marker above it")
                    continue
                if marker.group(1).startswith("skip"):
                    skipped += 1
                    continue
                expected = int(marker.group(2) or 0)
                ran += 1
                if language in ("sh", "bash"):
                    status, output = run_script("set -euo pipefail\n" + "\n".join(body),
                                                workdir, env, isolation)
                    if status != expected:
                        failures.append(f"{where}: exit {status}, not {expected}:\n{output}")
                    continue
                # A transcript: "$ command" lines, each followed by its output.
                commands, shown = [], []
                for text in body:
                    if text.startswith("$ "):
                        commands.append(text[2:])
                    elif text.strip() and text.strip() != "...":
                        shown.append(text.rstrip())
                status, output = run_script("\n".join(commands), workdir, env, isolation)
                if status != expected:
                    failures.append(f"{where}: exit {status}, not {expected}:\n{output}")
                printed = [l.rstrip() for l in output.splitlines()]
                for text in shown:
                    if text not in printed:
                        failures.append(f"{where}: the block shows\n  {text}\n"
                                        f"but the command printed:\n{output}")
    check_metrics(source, failures)
    for failure in failures:
        print(f"FAIL {failure}\n")
    print(f"readme_test: {ran} blocks run, {skipped} skipped (marked), "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
