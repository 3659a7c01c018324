#!/usr/bin/env python3
"""The README's install step: `cmake --install` puts allocd and allocctl on
PATH, and `pip install build/release/python` ships the package with both
of its libraries (liballocd_torch.so where the build has it), so that
`allocd.enable()` finds them after a normal install.

    install_test.py BUILD_DIR

pip builds the package offline here: in a venv of Debian's python3 with its
setuptools and wheel (python3-venv, python3-setuptools, python3-wheel);
without them the pip half is skipped (exit 77).
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def run(*command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def main():
    build = pathlib.Path(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory(prefix="install_test_") as tmp:
        tmp = pathlib.Path(tmp)
        prefix = tmp / "prefix"
        r = run("cmake", "--install", str(build), "--prefix", str(prefix))
        if r.returncode != 0:
            failures.append(f"cmake --install failed:\n{r.stdout}{r.stderr}")
        for tool in ("allocd", "allocctl"):
            path = prefix / "bin" / tool
            if not path.exists():
                failures.append(f"cmake --install put no {tool} into {prefix / 'bin'}")
                continue
            r = run(tool, "--help", env={"PATH": str(prefix / "bin")})
            if r.returncode != 0 or "Exit status" not in r.stdout:
                failures.append(f"{tool} --help from PATH: exit {r.returncode}\n{r.stdout}{r.stderr}")

        package = build / "python"
        libraries = sorted(p.name for p in (package / "allocd").glob("*.so"))
        python = shutil.which("python3", path="/usr/bin")
        probe = python and run(python, "-c", "import venv, setuptools, wheel")
        if not probe or probe.returncode != 0:
            print("install_test: no Debian python3 with venv, setuptools and wheel: "
                  "pip install not tested")
            for failure in failures:
                print(f"FAIL {failure}")
            return 1 if failures else SKIP
        venv = tmp / "venv"
        run(python, "-m", "venv", "--system-site-packages", str(venv))
        # pip builds in the source folder: a copy keeps the build tree clean.
        copy = tmp / "package"
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        r = run(str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
                str(copy))
        if r.returncode != 0:
            failures.append(f"pip install failed:\n{r.stdout}{r.stderr}")
        r = run(str(venv / "bin" / "python"), "-c",
                "import allocd, os; d = os.path.dirname(allocd.__file__); "
                "print(' '.join(sorted(f for f in os.listdir(d) if f.endswith('.so'))));"
                "[allocd._bindings.library_path(n) for n in " + repr(libraries) + "]",
                cwd=tmp)
        installed = r.stdout.split()
        if r.returncode != 0 or installed != libraries:
            failures.append(f"the installed package has {installed}, the build {libraries}:\n"
                            f"{r.stderr}")
        if "liballocd_client.so" not in libraries:
            failures.append(f"{package}/allocd has no liballocd_client.so: build allocd_client_c")
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"install_test: {len(failures)} failures ({' '.join(libraries)} shipped)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
